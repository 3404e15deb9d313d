# Sourced by the bench scripts (with $venv, $py, log and die defined): makes $venv hold exactly
# the versions pinned in tools/bench-requirements.txt, reusing it while it does.
# The requirements file is a complete lock (every transitive dependency pinned), installed
# with --no-deps: pnnx declares torch, which its converter binary does not need.
reqs=tools/bench-requirements.txt
check_pins='
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        if m.version(name) != want:
            sys.exit(1)'
if [[ ! -x "$py" ]]; then
    log "creating $venv"
    python3 -m venv "$venv"
fi
if ! "$py" -c "$check_pins" "$reqs" 2>/dev/null; then
    log "installing $reqs into $venv"
    "$py" -m pip install --quiet --disable-pip-version-check --no-deps -r "$reqs" \
        || die "pip could not install $reqs"
fi

