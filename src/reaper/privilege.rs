//! Whether the account may read the whole processlist (PROCESS).

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// Whether the current account holds PROCESS globally, directly or through an active role.
/// `SHOW GRANTS` for the session lists both on MySQL and MariaDB alike, where
/// information_schema.USER_PRIVILEGES shows only what was granted to the account itself.
pub(super) async fn has_process_privilege(conn: &mut Conn) -> anyhow::Result<bool> {
    let grants: Vec<String> = conn
        .query("SHOW GRANTS")
        .await
        .context("checking the PROCESS privilege")?;
    Ok(grants_process(&grants))
}

/// Whether one of `SHOW GRANTS`' lines gives PROCESS on `*.*`.
fn grants_process(grants: &[String]) -> bool {
    grants.iter().any(|line| {
        let Some(rest) = line.strip_prefix("GRANT ") else {
            return false;
        };
        let Some((privileges, on)) = rest.split_once(" ON ") else {
            return false;
        };
        on.starts_with("*.* ")
            && privileges
                .split(',')
                .map(str::trim)
                .any(|p| p == "PROCESS" || p == "ALL PRIVILEGES" || p == "ALL")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_comes_directly_or_through_a_role() {
        let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // MySQL expands an active role into the account's own line.
        assert!(grants_process(&lines(&[
            "GRANT PROCESS ON *.* TO `r1`@`%`"
        ])));
        // MariaDB lists the active role's grants on their own line.
        assert!(grants_process(&lines(&[
            "GRANT `myjob_reaper` TO `r1`@`127.0.0.1`",
            "GRANT USAGE ON *.* TO `r1`@`127.0.0.1` IDENTIFIED BY PASSWORD '*D82'",
            "GRANT PROCESS ON *.* TO `myjob_reaper`",
        ])));
        assert!(grants_process(&lines(&[
            "GRANT SELECT, PROCESS, RELOAD ON *.* TO `a`@`%`"
        ])));
        assert!(grants_process(&lines(&[
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"
        ])));
        assert!(!grants_process(&lines(&[
            "GRANT USAGE ON *.* TO `w`@`%`",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `app`.`myjob_jobs` TO `w`@`%`",
            "GRANT ALL PRIVILEGES ON `app`.* TO `w`@`%`",
            "GRANT PROXY ON ''@'%' TO `w`@`%`",
            "GRANT `myjob_reaper`@`%` TO `w`@`%`",
        ])));
    }
}
