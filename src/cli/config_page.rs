//! myjob.toml(5): the man page of the configuration file, made from the commented example
//! `config/myjob.toml` that the package installs as /etc/myjob/myjob.toml, so that the page
//! and the file's comments say the same thing.

use roff::{bold, italic, roman, Roff};

/// The example configuration, key by key documented in its comments.
const EXAMPLE: &str = include_str!("../../config/myjob.toml");

/// The page, in roff: one section per table of the file, one entry per key with the comment
/// above it. A commented-out key (`# password_file = …`) is an optional one.
pub fn render(version: &str) -> String {
    let mut page = Roff::new();
    page.control("TH", ["MYJOB.TOML", "5", "", &format!("myjob {version}")])
        .control("SH", ["NAME"])
        .text([roman("myjob.toml - the configuration of myjob workers")])
        .control("SH", ["SYNOPSIS"])
        .text([bold("/etc/myjob/myjob.toml")])
        .control("SH", ["DESCRIPTION"])
        .text([roman(
            "Every myjob@N instance reads this TOML file at start and again on SIGHUP \
             (systemctl reload myjob@N); a file that does not check out is logged and the \
             settings in use are kept. Unknown keys are errors. Durations are written like \
             \"500ms\", \"30s\", \"5m\", \"1h\". Check a file with ",
        )])
        .text([
            bold("myjob check-config"),
            roman(", which exits 78 naming the key at fault."),
        ]);
    let mut comment: Vec<&str> = Vec::new();
    // The file's own header is the DESCRIPTION above.
    let body = EXAMPLE.find("\n[").map_or(EXAMPLE, |at| &EXAMPLE[at + 1..]);
    for line in body.lines() {
        let line = line.trim_end();
        if let Some(table) = table_line(line) {
            // A commented-out table (`# [[schedule]]`) is an optional one: its keys are
            // commented out too, and belong to it, not to the table before. The comment
            // above a header is the section's introduction.
            page.control("SH", [table]);
            paragraph(&mut page, &mut comment);
        } else if let Some(key) = key_line(line) {
            page.control("TP", []);
            if line.starts_with('#') {
                page.text([bold(key), roman(" (optional)")]);
            } else {
                page.text([bold(key)]);
            }
            paragraph(&mut page, &mut comment);
        } else if let Some(text) = line.strip_prefix('#') {
            comment.push(text.trim_start());
        }
    }
    page.control("SH", ["FILES"])
        .text([
            bold("/etc/myjob/myjob.toml"),
            roman(", read by every instance; owned by root, group myjob, mode 0640."),
        ])
        .control("SH", ["SEE ALSO"])
        .text([
            bold("myjob"),
            roman("(1), "),
            bold("myjob-check-config"),
            roman("(1), "),
            italic("/usr/share/doc/myjob/README.md"),
            roman(", "),
            italic("/usr/share/doc/myjob/docs/configuration.md"),
        ]);
    page.render()
}

/// `[table]` or `[[table]]`, or the same commented out (`# [[schedule]]`): the header.
fn table_line(line: &str) -> Option<&str> {
    let header = line.strip_prefix("# ").unwrap_or(line).trim_end();
    let name = header.trim_start_matches('[').trim_end_matches(']');
    let ok = header.starts_with('[')
        && header.ends_with(']')
        && !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    ok.then_some(header)
}

/// `key = value`, or `# key = value` for an optional key: the key and its example value.
fn key_line(line: &str) -> Option<&str> {
    let setting = line.strip_prefix("# ").unwrap_or(line);
    let (key, _) = setting.split_once(" = ")?;
    let is_key = !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    is_key.then_some(setting)
}

/// The comment lines gathered so far, as one filled paragraph.
fn paragraph(page: &mut Roff, comment: &mut Vec<&str>) {
    if !comment.is_empty() {
        page.text([roman(comment.join(" "))]);
        comment.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_the_example_is_on_the_page() {
        let page = render("0.0.0");
        let keys: Vec<&str> = EXAMPLE.lines().filter_map(key_line).collect();
        assert!(keys.len() > 20, "{keys:?}");
        for key in keys {
            let name = key.split(' ').next().unwrap();
            assert!(
                page.contains(&format!("\\fB{name} =")),
                "{name} is not on the page"
            );
        }
    }

    /// Every table of the file has its section, a commented-out one (`# [[schedule]]`, an
    /// optional table) too, and each key sits in its own table's section: the page once
    /// filed `[[schedule]]`'s keys under `[[queue]]`.
    #[test]
    fn every_table_has_its_section_and_its_keys() {
        let page = render("0.0.0");
        let tables: Vec<&str> = EXAMPLE.lines().filter_map(table_line).collect();
        assert!(tables.len() >= 7, "{tables:?}");
        assert!(tables.contains(&"[[schedule]]"), "{tables:?}");
        // Each key's table, by the file; each key's section, by the page.
        let mut table = "";
        for line in EXAMPLE.lines() {
            if let Some(t) = table_line(line) {
                table = t;
                continue;
            }
            let Some(key) = key_line(line) else { continue };
            let name = key.split(' ').next().unwrap();
            let at = page.find(&format!("\\fB{name} =")).unwrap();
            let section = page[..at].rfind(".SH ").map(|s| &page[s + 4..]).unwrap();
            let section = section.lines().next().unwrap();
            if table.is_empty() {
                continue;
            }
            assert!(
                page.contains(&format!(".SH {table}\n")),
                "no section {table}"
            );
            // A key of one name in two tables (`name`): its first place is checked.
            if page.matches(&format!("\\fB{name} =")).count() == 1 {
                assert_eq!(section, table, "{name} is filed under {section}");
            }
        }
        for t in tables {
            assert!(page.contains(&format!(".SH {t}\n")), "{t}");
        }
        // schedule's name and queue, beside queue's own name.
        let schedule = &page[page.find(".SH [[schedule]]").unwrap()..];
        assert!(schedule.contains("\\fBname =") && schedule.contains("\\fBcron ="));
    }
}
