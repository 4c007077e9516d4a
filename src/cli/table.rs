//! How the operator commands print: an aligned table for people, one JSON document for
//! scripts.

use std::io::Write as _;

use serde::Serialize;
use tabwriter::TabWriter;

use crate::error::{Error, ExitCode, OrExit};

/// Prints `rows` under `header` (none when it is empty), each column as wide as its widest
/// cell. A tab or newline in
/// a cell would break the alignment, so it becomes a space.
pub fn print(header: &[&str], rows: &[Vec<String>]) -> Result<(), Error> {
    let mut out = TabWriter::new(std::io::stdout().lock()).padding(2);
    let clean = |cell: &str| cell.replace(['\t', '\n', '\r'], " ");
    let mut text = String::new();
    if !header.is_empty() {
        text = header.join("\t") + "\n";
    }
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| clean(c)).collect();
        text += &cells.join("\t");
        text += "\n";
    }
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .or_exit(ExitCode::Software)
}

/// Prints `value` as one line of JSON.
pub fn print_json(value: &impl Serialize) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| writeln!(out))
        .or_exit(ExitCode::Software)
}

/// A UTC ISO 8601 time as a person reads it: `2026-11-23 07:14:59`, no fraction.
pub fn time(iso: &str) -> String {
    iso.get(..19).unwrap_or(iso).replace('T', " ")
}

/// An optional cell: `-` for none.
pub fn or_dash(cell: Option<&str>) -> String {
    cell.map_or_else(|| "-".to_owned(), str::to_owned)
}
