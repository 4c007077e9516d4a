//! How the operator commands print: an aligned table for people, one JSON document for
//! scripts.

use std::io::Write as _;

use serde::Serialize;
use tabwriter::TabWriter;

use crate::error::{Error, ExitCode, OrExit};

/// Prints `rows` under `header` (none when it is empty), each column as wide as its widest
/// cell. Cells are [`clean`]ed: text from the database reaches the terminal without its
/// control characters.
pub fn print(header: &[&str], rows: &[Vec<String>]) -> Result<(), Error> {
    let mut out = TabWriter::new(std::io::stdout().lock()).padding(2);
    let mut text = String::new();
    if !header.is_empty() {
        let cells: Vec<String> = header.iter().map(|c| clean(c)).collect();
        text = cells.join("\t") + "\n";
    }
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| clean(c)).collect();
        text += &cells.join("\t");
        text += "\n";
    }
    written(out.write_all(text.as_bytes()).and_then(|()| out.flush()))
}

/// A cell as a terminal may show it. A tab or newline would break the alignment, so it
/// becomes a space; every other control character (ESC and so the escape sequences a queue
/// name, a unique key or an error may hold, CR, DEL, the C1 controls U+0080 to U+009F)
/// becomes U+FFFD, so that no text from the database can move the cursor, recolour the
/// terminal or rewrite a line already shown. JSON output keeps the text: serde escapes it.
pub fn clean(cell: &str) -> String {
    cell.chars()
        .map(|c| match c {
            '\t' | '\n' => ' ',
            c if c.is_control() => '\u{FFFD}',
            c => c,
        })
        .collect()
}

/// Prints `value` as one line of JSON.
pub fn print_json(value: &impl Serialize) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    written(
        serde_json::to_writer(&mut out, value)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out)),
    )
}

/// The end of a write to stdout. A reader that stopped reading (`myjob list | head`) closed
/// the pipe by its own choice: that is no failure of the command, which ends quietly with 0,
/// as `ls` and `grep` do.
fn written(result: std::io::Result<()>) -> Result<(), Error> {
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.or_exit(ExitCode::Software),
    }
}

/// A UTC ISO 8601 time as a person reads it: `2026-11-23 07:14:59`, no fraction.
pub fn time(iso: &str) -> String {
    iso.get(..19).unwrap_or(iso).replace('T', " ")
}

/// An optional cell: `-` for none.
pub fn or_dash(cell: Option<&str>) -> String {
    cell.map_or_else(|| "-".to_owned(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn cells_lose_their_control_characters() {
        assert_eq!(clean("plain: é ✓"), "plain: é ✓");
        assert_eq!(clean("a\tb\nc"), "a b c");
        assert_eq!(
            clean("q\x1b[31mred\r\x07\x7f\u{9b}2J\u{85}\0"),
            "q\u{FFFD}[31mred\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}2J\u{FFFD}\u{FFFD}"
        );
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let out = clean(&c.to_string());
            assert!(!out.chars().any(char::is_control), "{c:?}");
        }
    }
}
