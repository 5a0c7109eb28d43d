//! Rebuild when a migration changes (`sqlx::migrate!` embeds `migrations/` at compile time), and
//! embed the admin web app: every file under `../frontend/dist` becomes an entry of
//! `$OUT_DIR/web_assets.rs` (`include_bytes!`), served by `admin::web`. The built `dist/` is
//! committed, so `cargo build` needs no npm; without it the binary serves a page that says how
//! to build the app.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dist = manifest.join("../frontend/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    walk(&dist, &mut files);
    let mut src = String::from("/// Embedded web app files: (path under dist/, bytes).\n");
    src.push_str("pub(crate) static ASSETS: &[(&str, &[u8])] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f
            .strip_prefix(&dist)
            .map(|r| r.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        let abs = f.canonicalize().unwrap_or_else(|_| f.clone());
        let _ = writeln!(
            src,
            "    ({rel:?}, include_bytes!({:?})),",
            abs.display().to_string()
        );
    }
    src.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("web_assets.rs");
    if let Err(e) = std::fs::write(&out, src) {
        println!("cargo:warning=cannot write {}: {e}", out.display());
    }
}
