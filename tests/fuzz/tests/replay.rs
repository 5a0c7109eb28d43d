//! Replays every committed corpus input (seeds, and inputs that once failed) through its
//! target: a crash the fuzzer found stays fixed in every `cargo test`.

use std::path::Path;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut total = 0;
    for (name, run) in codex_gateway_fuzz::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()));
        files.sort();
        assert!(!files.is_empty(), "target {name} has no corpus");
        for f in files {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if let Err(p) = std::panic::catch_unwind(|| run(&data)) {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                panic!("{name}: {} fails: {msg}", f.display());
            }
            total += 1;
        }
    }
    println!("replayed {total} corpus inputs");
}
