//! The PP-OCR models (detector, recogniser, direction classifier) compiled with the input shapes
//! of each reference case and run on the CPU, compared with ONNX Runtime's outputs.
//!
//! Data: `target/models/*.onnx` and `target/references/` (manifest.txt, `<model>/<shape>/
//! {input,output}_<i>.npy`), made by `bash tools/setup.sh` (tools/make_references.py says how
//! the inputs and the reference were made). Prints the worst element of every output.

use anyhow::{Context, Result, anyhow, bail};
use ingot_tests::data::read_npy;
use ingot_tests::paths::generated;
use ingot_tests::{Tolerance, compare, compile, run, session};

const TOLERANCE: Tolerance = Tolerance::new(1e-4, 1e-5);

#[test]
fn det() {
    check_model("ch_PP-OCRv4_det_infer.onnx");
}

#[test]
fn rec() {
    check_model("ch_PP-OCRv4_rec_infer.onnx");
}

#[test]
fn cls() {
    check_model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
}

/// One line of manifest.txt:
/// `model=FILE case=DIR inputs=NAME:1x3x48x192[,...] outputs=NAME[,...]`.
struct Case {
    model: String,
    case: String,
    inputs: Vec<(String, Vec<usize>)>,
    outputs: Vec<String>,
}

fn manifest() -> Result<Vec<Case>> {
    let path = generated("references/manifest.txt")?;
    let text = std::fs::read_to_string(&path)?;
    let mut cases = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| anyhow!("{}: no {key}= in {line:?}", path.display()))
        };
        let inputs = field("inputs")?
            .split(',')
            .map(|spec| {
                let (name, dims) = spec
                    .rsplit_once(':')
                    .ok_or_else(|| anyhow!("bad input {spec:?} in {line:?}"))?;
                let dims = dims
                    .split('x')
                    .map(str::parse)
                    .collect::<Result<Vec<usize>, _>>()
                    .with_context(|| format!("bad shape in {line:?}"))?;
                Ok((name.to_string(), dims))
            })
            .collect::<Result<_>>()?;
        cases.push(Case {
            model: field("model")?.to_string(),
            case: field("case")?.to_string(),
            inputs,
            outputs: field("outputs")?.split(',').map(String::from).collect(),
        });
    }
    Ok(cases)
}

fn check_model(model: &str) {
    let result = (|| -> Result<Vec<String>> {
        let cases: Vec<Case> = manifest()?
            .into_iter()
            .filter(|c| c.model == model)
            .collect();
        if cases.is_empty() {
            bail!("references/manifest.txt has no case for {model}");
        }
        let mut failures = Vec::new();
        for case in &cases {
            failures.extend(check_case(case)?);
        }
        Ok(failures)
    })();
    match result {
        Ok(failures) => assert!(failures.is_empty(), "{}", failures.join("\n")),
        Err(e) => panic!("{model}: {e:#}"),
    }
}

/// Compiles and runs one case; returns a line per output that does not match.
fn check_case(case: &Case) -> Result<Vec<String>> {
    let model_path = generated(&format!("models/{}", case.model))?;
    let dir = generated(&format!("references/{}", case.case))?;
    let bundle = compile(&model_path, &case.inputs)?;
    let mut session = session(&bundle)?;
    let inputs = (0..case.inputs.len())
        .map(|i| read_npy(&dir.join(format!("input_{i}.npy"))))
        .collect::<Result<Vec<_>>>()?;
    let got = run(&mut session, &inputs)?;
    if got.len() != case.outputs.len() {
        bail!(
            "{}: {} outputs, want {}",
            case.case,
            got.len(),
            case.outputs.len()
        );
    }
    let mut failures = Vec::new();
    for (i, (g, name)) in got.iter().zip(&case.outputs).enumerate() {
        let want = read_npy(&dir.join(format!("output_{i}.npy")))?;
        let ours = &session.outputs()[i].name;
        if ours != name {
            failures.push(format!(
                "{}: output {i} is named '{ours}', want '{name}'",
                case.case
            ));
        }
        match compare(g, &want, TOLERANCE) {
            Ok(c) => {
                println!("{} {name}: {c}", case.case);
                if !c.passed() {
                    failures.push(format!("{} {name}: {c}", case.case));
                }
            }
            Err(e) => failures.push(format!("{} {name}: {e}", case.case)),
        }
    }
    Ok(failures)
}
