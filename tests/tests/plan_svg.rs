//! The plan's SVG drawn by a real renderer: `rsvg-convert` (Debian's `librsvg2-bin`) turns
//! the SVG of `ingot plan --format svg` into a PNG, and the PNG must show the plan without
//! hovering: not blank, not one colour, boxes in several light colours (a renderer that does
//! not read a colour draws it black), at the size the SVG asks for.
//!
//! Models: the committed `examples/plan-snapshot/model.onnx`, and PP-OCR's detector (a big
//! arena) and recogniser (weights larger than the arena) from `target/models/`, made by
//! `bash tools/setup.sh`. The PNGs stay in `target/ingot-tests/plan_svg/` for a look.

use ingot_compiler::plan::render;
use ingot_compiler::{CompileOptions, bundle, compile_graph};
use ingot_tests::paths::{generated, repo_root, scratch_dir};
use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plan of `model` as SVG, the way `ingot plan --format svg` prints it.
fn plan_svg(model: &Path, shape: &[usize]) -> String {
    let options =
        CompileOptions { input_shapes: vec![("x".into(), shape.to_vec())], ..Default::default() };
    let c = compile_graph(model, &options)
        .unwrap_or_else(|e| panic!("cannot compile {}: {e}", model.display()));
    render::svg(&bundle::variant(&c.variant("main"), &[]))
}

/// `svg` rendered to a PNG by `rsvg-convert`, in a scratch dir; fails (never skips) when the
/// renderer is not installed.
fn rasterise(name: &str, svg: &str) -> PathBuf {
    let dir = scratch_dir(&format!("plan_svg/{name}"));
    let (svg_path, png_path) = (dir.join("plan.svg"), dir.join("plan.png"));
    std::fs::write(&svg_path, svg).unwrap();
    let out = match Command::new("rsvg-convert").arg(&svg_path).arg("-o").arg(&png_path).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "rsvg-convert is missing: this test renders the plan's SVG with it; install it \
             with `apt-get install librsvg2-bin` (Debian/Ubuntu) or `brew install librsvg`"
        ),
        Err(e) => panic!("cannot run rsvg-convert: {e}"),
    };
    assert!(
        out.status.success(),
        "rsvg-convert failed on {}: {}",
        svg_path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    png_path
}

/// A decoded PNG as 8-bit RGB pixels.
struct Image {
    width: u32,
    height: u32,
    pixels: Vec<[u8; 3]>,
}

fn decode(path: &Path) -> Image {
    let file = std::fs::File::open(path).unwrap();
    let mut decoder = png::Decoder::new(BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().expect("the PNG fits in memory")];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(channels)
        .map(|p| match channels {
            1 | 2 => [p[0]; 3],
            _ if channels == 4 && p[3] == 0 => [255; 3], // transparent: the page shows
            _ => [p[0], p[1], p[2]],
        })
        .collect();
    Image { width: info.width, height: info.height, pixels }
}

/// The size an SVG asks for: its root's `width` and `height`.
fn svg_size(svg: &str) -> (u32, u32) {
    let attr = |name: &str| -> u32 {
        let start = svg.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        let len = svg[start..].find('"').unwrap();
        svg[start..start + len].parse::<f64>().unwrap().round() as u32
    };
    (attr("width"), attr("height"))
}

/// Renders the plan of `model` and checks the picture reads.
fn check(name: &str, model: &Path, shape: &[usize]) {
    let svg = plan_svg(model, shape);
    assert!(!svg.contains("hsl("), "{name}: colours must be plain rgb()");
    assert!(svg.contains(" KiB</text>") || svg.contains(" MiB</text>"), "{name}: byte ticks");
    let png = rasterise(name, &svg);
    let image = decode(&png);
    assert_eq!((image.width, image.height), svg_size(&svg), "{name}: {}", png.display());
    let total = image.pixels.len();
    let mut counts: BTreeMap<[u8; 3], usize> = BTreeMap::new();
    for &p in &image.pixels {
        *counts.entry(p).or_default() += 1;
    }
    // Ink: anything not near white (the page and the plot's background are both near white).
    let ink = image.pixels.iter().filter(|p| p.iter().any(|&c| c < 235)).count();
    let black = image.pixels.iter().filter(|p| p.iter().all(|&c| c < 40)).count();
    // Colours of boxes: tinted (not the greys of text, lines and antialiasing) and covering
    // at least a 20x20 square's worth of pixels.
    let tinted = |c: &[u8; 3]| c.iter().max().unwrap() - c.iter().min().unwrap() >= 30;
    let mut fills: Vec<([u8; 3], usize)> =
        counts.iter().filter(|&(c, &n)| tinted(c) && n >= 400).map(|(&c, &n)| (c, n)).collect();
    fills.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let summary = format!(
        "{name}: {} ({}x{}): {} colours, {} tinted fills ({:?}), ink {:.1}%, black {:.1}%",
        png.display(),
        image.width,
        image.height,
        counts.len(),
        fills.len(),
        &fills[..fills.len().min(6)],
        100.0 * ink as f64 / total as f64,
        100.0 * black as f64 / total as f64,
    );
    println!("{summary}");
    assert!(counts.len() > 1, "the PNG is one colour: {summary}");
    assert!(ink * 20 >= total, "the PNG is (nearly) blank: {summary}");
    assert!(fills.len() >= 4, "fewer than 4 colours fill any area: {summary}");
    assert!(black * 10 < total, "the boxes are drawn black: {summary}");
}

#[test]
fn the_plan_snapshot_example_renders_to_a_png_that_reads() {
    let model = repo_root().join("examples/plan-snapshot/model.onnx");
    check("plan_snapshot", &model, &[1, 3, 32, 32]);
}

#[test]
fn ppocr_det_plan_renders_to_a_png_that_reads() {
    let model = generated("models/ch_PP-OCRv4_det_infer.onnx").unwrap_or_else(|e| panic!("{e:#}"));
    check("ppocr_det", &model, &[1, 3, 480, 480]);
}

#[test]
fn ppocr_rec_plan_renders_to_a_png_that_reads() {
    let model = generated("models/ch_PP-OCRv4_rec_infer.onnx").unwrap_or_else(|e| panic!("{e:#}"));
    check("ppocr_rec", &model, &[1, 3, 48, 320]);
}
