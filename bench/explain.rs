//! The claim statement as the server plans it, printed under the table.

use std::fmt::Write as _;

use mysql_async::prelude::*;

use crate::harness::Bench;

impl Bench {
    pub(crate) async fn explain(&self) -> String {
        let mut conn = self.conn().await;
        let rows: Vec<mysql_async::Row> = conn
            .exec(
                format!("EXPLAIN {}", myjob::store::jobs::CLAIM),
                (1u64, "bench", "bench", "bench", 0i16, 0i16, 1u64, 100u64),
            )
            .await
            .unwrap();
        let mut text = String::new();
        for row in rows {
            let cols: Vec<String> = row
                .columns_ref()
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    format!(
                        "{}={}",
                        c.name_str(),
                        row.as_ref(i).map_or("NULL".into(), value_text)
                    )
                })
                .collect();
            let _ = writeln!(text, "{}", cols.join(" "));
        }
        text.trim_end().to_owned()
    }
}

fn value_text(v: &mysql_async::Value) -> String {
    match v {
        mysql_async::Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        mysql_async::Value::NULL => "NULL".into(),
        other => other.as_sql(true),
    }
}
