//! The repository explains itself (issue 26), checked from the files:
//! - no source or documentation file refers to notes kept outside the repository (the knowledge
//!   the code leans on lives in `docs/`: docs/protocol.md, docs/io-traps.md,
//!   docs/conventions.md);
//! - every `docs/<page>.md#<anchor>` cited anywhere, and every `(#anchor)` / `(page.md#anchor)`
//!   link inside `docs/`, names a heading that exists on that page (GitHub's slug rules);
//! - the module graphs of `gateway` and `admin` (built from `crate::` / `super::` / `self::`
//!   paths; a node is a top-level module) have exactly the cycles listed in [`KNOWN_CYCLES`],
//!   a ratchet: a new cycle or a grown one fails, and so does a listed one that was broken or
//!   shrank, asking for the list to be updated (docs/conventions.md#module-cycles).
//!
//! Each checker is also run on a planted fault and must report it, so a checker that stopped
//! checking fails the test. No build, network or tool is needed: plain file reads.

// A panic is the failure report here, helpers included.
#![allow(clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// This file: it names the patterns it looks for.
const SELF: &str = "tests/tests/repo_docs.rs";

/// Directories never scanned: build outputs, dependencies, third-party code, generated
/// bundles and fuzz corpora (binary data).
fn skipped_dir(rel: &str, name: &str) -> bool {
    name.starts_with('.')
        || name == "target"
        || name == "node_modules"
        || matches!(rel, "vendor" | "frontend/dist" | "tests/fuzz/corpus")
}

/// Every text file of the repository (relative path, contents), in path order.
fn repo_files() -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .replace('\\', "/");
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if p.is_dir() {
                if !skipped_dir(&rel, &name) {
                    walk(root, &p, out);
                }
            } else if p.metadata().map(|m| m.len()).unwrap_or(u64::MAX) <= 4 << 20 {
                // Text only: binary files (images, corpora) do not read as UTF-8.
                if let Ok(text) = std::fs::read_to_string(&p) {
                    out.push((rel, text));
                }
            }
        }
    }
    let root = root();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

// --- references to notes outside the repository ------------------------------------------

/// The notes that lived outside the repository (a shared folder next to it). The crate
/// `codex-protocol` shares a name with one of them, so only the `.md` file name counts.
const OUTSIDE_NOTES: &[&str] = &[
    "../shared",
    "/work/shared",
    "design.md",
    "codex-protocol.md",
    "monoio-notes",
    "peers-and-protocol",
    "conventions #",
    "conventions §",
];

/// `file:line: text` for every line of `text` that refers to an outside note.
fn outside_references(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        let named = OUTSIDE_NOTES.iter().any(|n| lower.contains(n));
        // `conventions.md` is ours only as `docs/conventions.md`.
        let bare_conventions = lower
            .match_indices("conventions.md")
            .any(|(at, _)| !lower[..at].ends_with("docs/"));
        if named || bare_conventions {
            found.push(format!("{path}:{}: {}", i + 1, line.trim()));
        }
    }
    found
}

#[test]
fn no_file_refers_to_notes_outside_the_repository() {
    // The checker reports what it must (planted), and passes what it must.
    for planted in [
        "//! See codex-protocol.md §2.6.",
        "// (monoio-notes §5.4)",
        "see `../shared/design.md`",
        "(conventions #3)",
        "conventions.md §12",
    ] {
        assert_eq!(
            outside_references("planted.rs", planted).len(),
            1,
            "not reported: {planted}"
        );
    }
    for fine in [
        "docs/conventions.md#tests",
        "codex-protocol = { path = \"gateway/protocol\" }",
        "docs/protocol.md#error-bodies",
    ] {
        assert!(outside_references("fine.rs", fine).is_empty(), "{fine}");
    }

    let files = repo_files();
    assert!(
        files.iter().any(|(p, _)| p == "gateway/src/lifecycle.rs")
            && files.iter().any(|(p, _)| p == "docs/architecture.md"),
        "the walk found too little"
    );
    let found: Vec<String> = files
        .iter()
        .filter(|(p, _)| p != SELF)
        .flat_map(|(p, t)| outside_references(p, t))
        .collect();
    assert!(
        found.is_empty(),
        "files refer to notes outside the repository; write what the code needs into docs/ \
         and cite it there (docs/conventions.md#self-explaining-repository):\n{}",
        found.join("\n")
    );
}

// --- cited doc anchors --------------------------------------------------------------------

/// GitHub's heading anchor: lower case; letters, digits, `-` and `_` kept; spaces become `-`;
/// everything else (backticks, punctuation) dropped.
fn slug(heading: &str) -> String {
    let mut s = String::new();
    for c in heading.trim().chars() {
        if c.is_alphanumeric() || c == '-' || c == '_' {
            s.extend(c.to_lowercase());
        } else if c == ' ' {
            s.push('-');
        }
    }
    s
}

/// The anchors of a Markdown page: its headings' slugs outside code fences, a repeated slug
/// numbered `-1`, `-2`... as GitHub does.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fence = false;
    for line in markdown.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence || !t.starts_with('#') {
            continue;
        }
        let text = t.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let base = slug(text);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

fn is_anchor_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// The (page, anchor) pairs `text` cites: `docs/<page>.md#<anchor>` anywhere; inside a page
/// of `docs/` (`own`), also Markdown links `](#anchor)` (to `own`) and `](<page>.md#anchor)`.
fn citations(text: &str, own: Option<&str>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let take_anchor =
        |rest: &str| -> String { rest.chars().take_while(|&c| is_anchor_char(c)).collect() };
    for (at, _) in text.match_indices("docs/") {
        let rest = &text[at + 5..];
        let page: String = rest.chars().take_while(|&c| is_anchor_char(c)).collect();
        if let Some(anchor) = rest[page.len()..].strip_prefix(".md#") {
            out.push((page, take_anchor(anchor)));
        }
    }
    if let Some(own) = own {
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            if let Some(anchor) = rest.strip_prefix('#') {
                out.push((own.to_owned(), take_anchor(anchor)));
            } else {
                let page: String = rest.chars().take_while(|&c| is_anchor_char(c)).collect();
                if let Some(anchor) = rest[page.len()..].strip_prefix(".md#") {
                    out.push((page, take_anchor(anchor)));
                }
            }
        }
    }
    // `docs/<page>.md#<anchor>` written as a pattern, not a citation.
    out.retain(|(page, anchor)| !page.is_empty() && !anchor.is_empty());
    out
}

/// `file: page#anchor (why)` for every citation in `files` that `pages` cannot resolve.
fn unresolved(
    files: &[(String, String)],
    pages: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut bad = Vec::new();
    for (path, text) in files {
        let own = path
            .strip_prefix("docs/")
            .and_then(|p| p.strip_suffix(".md"))
            .filter(|p| !p.contains('/'));
        for (page, anchor) in citations(text, own) {
            match pages.get(&page) {
                None => bad.push(format!("{path}: docs/{page}.md#{anchor} (no such page)")),
                Some(a) if !a.contains(&anchor) => {
                    bad.push(format!("{path}: docs/{page}.md#{anchor} (no such heading)"))
                }
                Some(_) => {}
            }
        }
    }
    bad
}

#[test]
fn cited_doc_anchors_exist() {
    // Slugs as GitHub makes them.
    assert_eq!(
        slug(" `previous_response_id` over HTTP"),
        "previous_response_id-over-http"
    );
    assert_eq!(
        slug(" Front door: our HTTP/1.1 server"),
        "front-door-our-http11-server"
    );
    assert_eq!(
        anchors("# A\n## Same\n```\n## Not a heading\n```\n### Same\n#nope\n"),
        ["a", "same", "same-1"].map(str::to_owned).into()
    );

    let files = repo_files();
    let pages: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .filter_map(|(p, t)| {
            let page = p.strip_prefix("docs/")?.strip_suffix(".md")?;
            (!page.contains('/')).then(|| (page.to_owned(), anchors(t)))
        })
        .collect();
    for page in ["protocol", "io-traps", "conventions", "architecture"] {
        assert!(pages.contains_key(page), "docs/{page}.md is missing");
    }

    // Planted: a citation of a missing heading and of a missing page are reported; real ones
    // are not.
    let planted = vec![
        (
            "gateway/src/x.rs".to_owned(),
            "// docs/protocol.md#error-bodies docs/protocol.md#no-such-heading".to_owned(),
        ),
        (
            "docs/x.md".to_owned(),
            "[a](#nowhere) docs/nope.md#a".to_owned(),
        ),
    ];
    let bad = unresolved(&planted, &pages);
    assert_eq!(bad.len(), 3, "{bad:?}");

    let cited: usize = files
        .iter()
        .map(|(p, t)| {
            citations(
                t,
                p.strip_prefix("docs/").and_then(|p| p.strip_suffix(".md")),
            )
            .len()
        })
        .sum();
    assert!(
        cited > 20,
        "too few citations found ({cited}): the scan stopped working"
    );
    let bad = unresolved(
        &files
            .into_iter()
            .filter(|(p, _)| p != SELF)
            .collect::<Vec<_>>(),
        &pages,
    );
    assert!(
        bad.is_empty(),
        "citations of docs/ sections that do not exist:\n{}",
        bad.join("\n")
    );
}

// --- module cycles ------------------------------------------------------------------------

/// The cycles among top-level modules known today, per crate. The list may only shrink: when a
/// cycle is broken, remove it here (the test says so); a new cycle is fixed in the code, not
/// added here (docs/conventions.md#module-cycles, docs/architecture.md draws them).
const KNOWN_CYCLES: &[(&str, &[&[&str]])] =
    &[("gateway", &[]), ("admin", &[]), ("gateway/protocol", &[])];

/// `src` without comments, and with every string and char literal emptied (`""`, `' '`), so
/// that only code is searched. Byte offsets are not kept.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        // Raw strings: r"..", r#".."#, br#".."#.
        let prev_ident = i > 0 && ident(b[i - 1]);
        if !prev_ident && (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r'))) {
            let mut j = i + if c == b'b' { 2 } else { 1 };
            let hashes = b[j..].iter().take_while(|&&h| h == b'#').count();
            j += hashes;
            if b.get(j) == Some(&b'"') {
                let mut end = vec![b'"'];
                end.extend(std::iter::repeat_n(b'#', hashes));
                let close = b[j + 1..]
                    .windows(end.len())
                    .position(|w| w == end.as_slice())
                    .map_or(b.len(), |p| j + 1 + p + end.len());
                out.push_str("\"\"");
                i = close;
                continue;
            }
        }
        if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
            continue;
        }
        if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                // The escape's first character (maybe a quote) is at i + 2.
                let close = b[i + 3..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map_or(b.len(), |p| i + 4 + p);
                out.push_str("' '");
                i = close;
                continue;
            }
            let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
            if b.get(i + 1 + ch_len) == Some(&b'\'') {
                out.push_str("' '");
                i += 2 + ch_len;
                continue;
            }
        }
        let ch = src[i..].chars().next().expect("char");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The index just past the `}` matching the `{` at `open`.
fn block_end(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier starting at `at` (empty when none).
fn ident_at(code: &str, at: usize) -> &str {
    let end = code[at..]
        .bytes()
        .position(|c| !is_ident_byte(c))
        .map_or(code.len(), |p| at + p);
    &code[at..end]
}

fn skip_ws(code: &[u8], mut at: usize) -> usize {
    while at < code.len() && code[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// The `mod NAME` items of `code` (comments and strings already removed): (start, name,
/// inline block span, test-only).
#[derive(Debug)]
struct ModItem {
    name: String,
    block: Option<(usize, usize)>,
    test_only: bool,
}

fn mod_items(code: &str) -> Vec<ModItem> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("mod") {
        if (at > 0 && is_ident_byte(b[at - 1]))
            || !b.get(at + 3).is_some_and(|c| c.is_ascii_whitespace())
        {
            continue;
        }
        let name_at = skip_ws(b, at + 3);
        let name = ident_at(code, name_at);
        if name.is_empty() {
            continue;
        }
        let after = skip_ws(b, name_at + name.len());
        let block = match b.get(after) {
            Some(b'{') => Some((after, block_end(b, after))),
            Some(b';') => None,
            _ => continue,
        };
        // The attributes and visibility right before `mod`: back to the previous item's end.
        let head_start = code[..at].rfind([';', '}', '{']).map_or(0, |p| p + 1);
        let head: String = code[head_start..at]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        out.push(ModItem {
            name: name.to_owned(),
            block,
            test_only: head.contains("#[cfg(test)]"),
        });
    }
    out
}

/// One use tree (`a::{b, c::d as e}`) as full paths, each with the name it binds.
fn use_paths(tree: &str) -> Vec<(Vec<String>, String)> {
    // Tokens: identifiers, `::`, `{`, `}`, `,`, `*`.
    let mut toks: Vec<String> = Vec::new();
    let b = tree.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if is_ident_byte(c) {
            let id = ident_at(tree, i);
            toks.push(id.to_owned());
            i += id.len();
        } else if tree[i..].starts_with("::") {
            toks.push("::".to_owned());
            i += 2;
        } else if matches!(c, b'{' | b'}' | b',' | b'*') {
            toks.push((c as char).to_string());
            i += 1;
        } else {
            i += 1;
        }
    }
    fn parse(
        toks: &[String],
        pos: &mut usize,
        prefix: &[String],
        out: &mut Vec<(Vec<String>, String)>,
    ) {
        let mut path = prefix.to_vec();
        loop {
            match toks.get(*pos).map(String::as_str) {
                Some("{") => {
                    *pos += 1;
                    loop {
                        if toks.get(*pos).map(String::as_str) == Some("}") {
                            *pos += 1;
                            return;
                        }
                        parse(toks, pos, &path, out);
                        match toks.get(*pos).map(String::as_str) {
                            Some(",") => *pos += 1,
                            Some("}") => {
                                *pos += 1;
                                return;
                            }
                            _ => return,
                        }
                    }
                }
                Some("*") => {
                    *pos += 1;
                    out.push((path, "*".to_owned()));
                    return;
                }
                Some(id) if id != "::" && id != "," && id != "}" => {
                    *pos += 1;
                    if id == "self"
                        && *pos > 0
                        && !path.is_empty()
                        && toks.get(*pos).map(String::as_str) != Some("::")
                    {
                        // `a::{self}` binds `a`.
                        let name = path.last().cloned().unwrap_or_default();
                        out.push((path, name));
                        return;
                    }
                    path.push(id.to_owned());
                    if toks.get(*pos).map(String::as_str) == Some("::") {
                        *pos += 1;
                        continue;
                    }
                    let mut name = id.to_owned();
                    if toks.get(*pos).map(String::as_str) == Some("as") {
                        name = toks.get(*pos + 1).cloned().unwrap_or_default();
                        *pos += 2;
                    }
                    out.push((path, name));
                    return;
                }
                _ => return,
            }
        }
    }
    let mut out = Vec::new();
    let mut pos = 0;
    parse(&toks, &mut pos, &[], &mut out);
    out
}

/// Every path of `code` that starts with `crate`, `super` or `self`, with the byte offset it
/// appears at: the trees of `use` items expanded, and paths written in the code.
fn anchored_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("use") {
        if (at > 0 && is_ident_byte(b[at - 1]))
            || !b.get(at + 3).is_some_and(|c| c.is_ascii_whitespace())
        {
            continue;
        }
        let end = code[at..].find(';').map_or(code.len(), |p| at + p);
        for (path, _) in use_paths(&code[at + 3..end]) {
            if path
                .first()
                .is_some_and(|s| ["crate", "super", "self"].contains(&s.as_str()))
            {
                out.push((at, path));
            }
        }
    }
    for start in ["crate", "super", "self"] {
        for (at, _) in code.match_indices(start) {
            if at > 0 && is_ident_byte(b[at - 1]) {
                continue;
            }
            let mut path = Vec::new();
            let mut i = at;
            loop {
                let id = ident_at(code, i);
                if id.is_empty() {
                    break;
                }
                path.push(id.to_owned());
                let j = skip_ws(b, i + id.len());
                if !code[j..].starts_with("::") {
                    break;
                }
                i = skip_ws(b, j + 2);
            }
            if path.len() > 1 && path[0] == start {
                out.push((at, path));
            }
        }
    }
    out
}

/// A crate's sources: module path (empty = the crate root) -> code (comments and strings
/// removed).
type Sources = BTreeMap<Vec<String>, String>;

fn crate_sources(src_dir: &Path) -> Sources {
    fn walk(dir: &Path, base: &Path, out: &mut Sources) {
        for e in std::fs::read_dir(dir).expect("src dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(base).expect("under src").with_extension("");
                let mut m: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if m == ["lib"] || m == ["main"] {
                    m.clear();
                } else if m.last().is_some_and(|l| l == "mod") {
                    m.pop();
                }
                let text = std::fs::read_to_string(&p).expect("source");
                out.insert(m, code_only(&text));
            }
        }
    }
    let mut out = Sources::new();
    walk(src_dir, src_dir, &mut out);
    out
}

/// The top-level module graph: `a -> b` when code of module `a` (or below it) names an item of
/// module `b` by a `crate::`, `super::` or `self::` path. Test-only modules (`#[cfg(test)]`)
/// count for nothing. A path to an item of the crate root counts for the module it is
/// re-exported from (`pub use b::Item;` in the root).
fn module_graph(sources: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&Vec<String>> = sources.keys().collect();
    // Test-only file modules: declared `#[cfg(test)] mod x;` by their parent.
    let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, code) in sources {
        for item in mod_items(code) {
            if item.test_only && item.block.is_none() {
                let mut child = m.clone();
                child.push(item.name);
                test_only.insert(child);
            }
        }
    }
    let is_test = |m: &[String]| (1..=m.len()).any(|k| test_only.contains(&m[..k]));
    // Names the crate root brings in from its modules.
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    if let Some(root) = sources.get(&Vec::new()) {
        let b = root.as_bytes();
        for (at, _) in root.match_indices("use") {
            if (at > 0 && is_ident_byte(b[at - 1]))
                || !b.get(at + 3).is_some_and(|c| c.is_ascii_whitespace())
            {
                continue;
            }
            let end = root[at..].find(';').map_or(root.len(), |p| at + p);
            for (path, name) in use_paths(&root[at + 3..end]) {
                let first = path.first().cloned().unwrap_or_default();
                if name != "*" && modules.contains(&vec![first.clone()]) {
                    reexports.insert(name, first);
                }
            }
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in sources {
        if m.is_empty() || is_test(m) {
            continue;
        }
        let node = m[0].clone();
        graph.entry(node.clone()).or_default();
        let items = mod_items(code);
        let test_blocks: Vec<(usize, usize)> = items
            .iter()
            .filter(|i| i.test_only)
            .filter_map(|i| i.block)
            .collect();
        for (at, path) in anchored_paths(code) {
            if test_blocks.iter().any(|&(s, e)| s <= at && at < e) {
                continue;
            }
            // The module the path is written in: the file's, plus enclosing inline modules.
            let mut here = m.clone();
            for i in &items {
                if let Some((s, e)) = i.block {
                    if s <= at && at < e {
                        here.push(i.name.clone());
                    }
                }
            }
            let mut abs: Vec<String> = match path[0].as_str() {
                "crate" => Vec::new(),
                "self" => here.clone(),
                _ => {
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    if ups > here.len() {
                        continue;
                    }
                    here[..here.len() - ups].to_vec()
                }
            };
            abs.extend(
                path.iter()
                    .skip_while(|s| ["crate", "self", "super"].contains(&s.as_str()))
                    .cloned(),
            );
            let Some(first) = abs.first() else { continue };
            let target = if modules.contains(&vec![first.clone()]) {
                // The deepest file module the path names, for the test-only check.
                let depth = (1..=abs.len())
                    .take_while(|&k| modules.contains(&abs[..k].to_vec()))
                    .last()
                    .unwrap_or(1);
                if is_test(&abs[..depth]) {
                    continue;
                }
                first.clone()
            } else if let Some(m) = reexports.get(first) {
                m.clone()
            } else {
                continue;
            };
            if target != node {
                graph.entry(node.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// Strongly connected components with more than one node (Tarjan), each sorted, in order.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("low");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("low");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> = graph
        .iter()
        .flat_map(|(k, v)| std::iter::once(k.as_str()).chain(v.iter().map(String::as_str)))
        .collect();
    for v in nodes {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

/// What differs between the cycles found and the known ones, as instructions.
fn cycle_report(krate: &str, found: &[Vec<String>], known: &[&[&str]]) -> Vec<String> {
    let known: Vec<BTreeSet<&str>> = known.iter().map(|c| c.iter().copied().collect()).collect();
    let mut report = Vec::new();
    for c in found {
        let set: BTreeSet<&str> = c.iter().map(String::as_str).collect();
        if known.contains(&set) {
            continue;
        }
        match known.iter().find(|k| !k.is_disjoint(&set)) {
            Some(k) if set.is_subset(k) => report.push(format!(
                "{krate}: the cycle {k:?} shrank to {c:?}: update KNOWN_CYCLES (it may only shrink)"
            )),
            Some(k) => report.push(format!(
                "{krate}: the cycle {k:?} grew to {c:?}: break the new edge (the list may only shrink)"
            )),
            None => report.push(format!(
                "{krate}: a new module cycle {c:?}: break it (docs/conventions.md#module-cycles)"
            )),
        }
    }
    for k in &known {
        if !found
            .iter()
            .any(|c| c.iter().any(|m| k.contains(m.as_str())))
        {
            report.push(format!(
                "{krate}: the cycle {k:?} is broken: remove it from KNOWN_CYCLES and from \
                 docs/architecture.md"
            ));
        }
    }
    report
}

fn sources_of(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(m, code)| {
            let path = if m.is_empty() {
                Vec::new()
            } else {
                m.split("::").map(str::to_owned).collect()
            };
            (path, code_only(code))
        })
        .collect()
}

#[test]
fn module_cycle_analysis_sees_what_it_must() {
    // A planted crate: `a <-> b` through a use tree and a `super::` path, `c -> a` only, `d`
    // reaches `c` through a root re-export, `e`'s mention of `d` is in a comment, a string and
    // a test module, and `f/g.rs` (a child of f) uses `super::super::a` from an inline module.
    let src = sources_of(&[
        ("", "mod a; mod b; mod c; mod d; mod e; mod f; pub use c::{Thing as Renamed, self};"),
        ("a", "use crate::{b::{self, X}, c};\nfn f() { let s = \"crate::e::x\"; }"),
        ("b", "fn g(y: super::a::Y) -> super::a::Y { y }"),
        ("c", "use crate::a::Z; pub struct Thing;"),
        ("d", "fn h(_: crate::Renamed) {}"),
        (
            "e",
            "// crate::d::x\nconst S: &str = r#\"crate::d\"#;\n#[cfg(test)]\nmod tests { use crate::d; }\n#[cfg(test)] mod more;",
        ),
        ("e::more", "use crate::d;"),
        ("f", "mod g;"),
        ("f::g", "mod inner { fn k() { super::super::super::a::go(); } }"),
    ]);
    let g = module_graph(&src);
    let edges = |m: &str| g.get(m).cloned().unwrap_or_default();
    assert_eq!(edges("a"), ["b", "c"].map(str::to_owned).into());
    assert_eq!(edges("b"), ["a"].map(str::to_owned).into());
    assert_eq!(edges("d"), ["c"].map(str::to_owned).into());
    assert!(edges("e").is_empty(), "{:?}", edges("e"));
    assert_eq!(edges("f"), ["a"].map(str::to_owned).into());
    let found = cycles(&g);
    assert_eq!(
        found,
        vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]
    );
    // The ratchet's verdicts.
    assert!(cycle_report("x", &found, &[&["a", "b", "c"]]).is_empty());
    assert!(cycle_report("x", &found, &[&["a", "b", "c", "d"]])[0].contains("shrank"));
    assert!(cycle_report("x", &found, &[&["a", "b"]])[0].contains("grew"));
    assert!(cycle_report("x", &found, &[])[0].contains("new module cycle"));
    assert!(cycle_report("x", &[], &[&["a", "b"]])[0].contains("broken"));
}

#[test]
fn module_cycles_only_shrink() {
    let mut report = Vec::new();
    for (krate, known) in KNOWN_CYCLES {
        let sources = crate_sources(&root().join(krate).join("src"));
        let graph = module_graph(&sources);
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        assert!(
            graph.len() >= 10 && edges >= 15,
            "{krate}: the graph is too small ({} modules, {edges} edges): the scan stopped working",
            graph.len()
        );
        report.extend(cycle_report(krate, &cycles(&graph), known));
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The client dialects of `codex-protocol` are siblings: `chat` and `anthropic` never name each
/// other; what both need (the neutral event layer `turn`, `tools`, `effort`, `json`) lives in
/// neutral modules (docs/architecture.md#module-dependencies-drawn-from-the-code).
#[test]
fn protocol_dialects_never_name_each_other() {
    let graph = module_graph(&crate_sources(&root().join("gateway/protocol/src")));
    for (a, b) in [("chat", "anthropic"), ("anthropic", "chat")] {
        assert!(
            graph.contains_key(a),
            "no module {a}: the scan stopped working"
        );
        assert!(
            !graph[a].contains(b),
            "codex-protocol: `{a}` names `{b}`; move what both need to a neutral module"
        );
    }
    for (dialect, neutral) in [
        ("chat", "turn"),
        ("anthropic", "turn"),
        ("anthropic", "tools"),
    ] {
        assert!(
            graph[dialect].contains(neutral),
            "`{dialect}` should read through `{neutral}`: the scan stopped working"
        );
    }
}
