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
        if line.starts_with('[') {
            page.control("SH", [line]);
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
        ]);
    page.render()
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
        for table in [
            "[database]",
            "[worker]",
            "[reaper]",
            "[retention]",
            "[metrics]",
            "[[queue]]",
        ] {
            assert!(page.contains(&format!(".SH {table}\n")), "{table}");
        }
    }
}
