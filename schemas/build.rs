//! Generates the codecs of every schema into `OUT_DIR` with `seqstream-sbe-codegen`, and the
//! codecs of the small feature schemas of `tests/xml/` that only the tests include.

use std::path::{Path, PathBuf};

use seqstream_sbe_codegen::Options;

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let mut schemas = vec![
        ("wire", manifest.join("xml/wire.xml")),
        ("orders", manifest.join("xml/orders.xml")),
        ("marketdata", manifest.join("xml/marketdata.xml")),
    ];
    if std::env::var_os("CARGO_FEATURE_CME").is_some() {
        let data = manifest.join("../data");
        schemas.push(("mdp3_v6", data.join("cme-mdp3/templates_FixBinary_v6.xml")));
        schemas.push(("mdp3_v9", data.join("cme-mdp3/templates_FixBinary_v9.xml")));
        schemas.push(("ilink3", data.join("cme-ilink3-schema/ilinkbinary_v5.xml")));
    }
    for (name, schema) in &schemas {
        generate(name, schema, &out_dir, &Options::default());
    }
    // Test schemas: included by tests/sbe_features.rs, outside this crate's modules.
    let tests = Options {
        runtime: "seqstream_schemas::codec".to_owned(),
    };
    for name in ["value_ref", "refs", "nested"] {
        let schema = manifest.join(format!("tests/xml/{name}.xml"));
        generate(&format!("test_{name}"), &schema, &out_dir, &tests);
    }
}

/// Writes the codec of `schema` to `OUT_DIR/{name}.rs` and its round-trip tests (included by
/// the tests) to `OUT_DIR/{name}_roundtrip.rs`.
fn generate(name: &str, schema: &Path, out_dir: &Path, options: &Options) {
    println!("cargo:rerun-if-changed={}", schema.display());
    let out = out_dir.join(format!("{name}.rs"));
    if let Err(e) = seqstream_sbe_codegen::generate_file(schema, &out, options) {
        panic!("generating {name} from {}: {e}", schema.display());
    }
    let xml = std::fs::read_to_string(schema).expect("schema was just read");
    let tests = seqstream_sbe_codegen::generate_roundtrip_tests(&xml)
        .unwrap_or_else(|e| panic!("round-trip tests for {name}: {e}"));
    std::fs::write(out_dir.join(format!("{name}_roundtrip.rs")), tests)
        .expect("OUT_DIR is writable");
}
