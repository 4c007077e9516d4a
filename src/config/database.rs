//! `[database]`: how to reach the server. The url is checked here, at load, for what the
//! driver would quietly get wrong (no host, a password cut at a `@`), so that a mistake is a
//! config error naming the key rather than a failure at every connection.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::raw::RawDatabase;
use super::values::duration;
use super::KeyError;

/// The environment variable that overrides `[database] url`.
pub const DATABASE_URL_ENV: &str = "MYJOB_DATABASE_URL";

/// How to reach the database. The password lives only inside `opts`, never in `display`.
#[derive(Clone)]
pub struct DatabaseSettings {
    pub opts: mysql_async::Opts,
    /// `mysql://user@host:port/db`, without the password: safe to log.
    pub display: String,
    /// Where the password came from, for the permission check: the config file's url, or
    /// `password_file`.
    pub url_has_password: bool,
    pub password_file: Option<PathBuf>,
    /// Whether connections are encrypted: the url asks for it (`require_ssl=true`), or
    /// `tls_ca` names the CA that signed the server's certificate.
    pub tls: bool,
    /// The longest a statement waits for a row lock or a metadata lock, in whole seconds.
    pub lock_wait_timeout: u64,
}

impl DatabaseSettings {
    /// The settings of a bare url, as `[database] url = …` alone would give them.
    pub fn from_url(url: &str) -> Result<DatabaseSettings, String> {
        let raw = RawDatabase {
            url: Some(url.to_owned()),
            ..RawDatabase::default()
        };
        validate(raw, None).map_err(|e| e.to_string())
    }
}

impl fmt::Debug for DatabaseSettings {
    // Written by hand so that no `{:?}` of the settings can print the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &self.display)
            .finish_non_exhaustive()
    }
}

/// Checks `[database]` into settings; `url_override` is [`DATABASE_URL_ENV`], which wins over
/// the url.
pub(super) fn validate(
    raw: RawDatabase,
    url_override: Option<String>,
) -> Result<DatabaseSettings, KeyError> {
    let key = if url_override.is_some() {
        DATABASE_URL_ENV
    } else {
        "database.url"
    };
    let url = url_override.or(raw.url).ok_or_else(|| {
        KeyError::new(
            "database.url",
            format!("missing (set it here, or in {DATABASE_URL_ENV})"),
        )
    })?;
    let opts = parse_url(&url).map_err(KeyError::at(key))?;
    let mut builder = mysql_async::OptsBuilder::from_opts(opts.clone());
    // mysql_async would otherwise switch a 127.0.0.1 connection over to the server's unix
    // socket, whose path may not exist where myjob runs (a container, a chroot).
    if !url.contains("prefer_socket") {
        builder = builder.prefer_socket(false);
    }
    let url_has_password = key == "database.url" && opts.pass().is_some();
    let password_file = raw.password_file;
    if let Some(file) = &password_file {
        if opts.pass().is_some() {
            return Err(KeyError::new(
                "database.password_file",
                "the url has a password already; keep it in one place".into(),
            ));
        }
        let text = std::fs::read_to_string(file).map_err(|e| {
            KeyError::new(
                "database.password_file",
                format!("cannot read {}: {e}", file.display()),
            )
        })?;
        let password = text.trim_end_matches(['\n', '\r']).to_owned();
        builder = builder.pass(Some(password));
    }
    if let Some(ca) = raw.tls_ca {
        let pem = read_ca(&ca).map_err(KeyError::at("database.tls_ca"))?;
        // The CA turns TLS on, verified against it, unless the url already set TLS options
        // (`verify_identity=false` for a certificate that does not name the host, say).
        let ssl = opts.ssl_opts().cloned().unwrap_or_default();
        builder = builder.ssl_opts(Some(ssl.with_root_certs(vec![pem.into()])));
    }
    let opts = mysql_async::Opts::from(builder);
    let tls = opts.ssl_opts().is_some();
    check_tls(&opts).map_err(KeyError::at(key))?;
    let display = format!(
        "mysql://{}@{}:{}/{}",
        opts.user().unwrap_or(""),
        opts.ip_or_hostname(),
        opts.tcp_port(),
        opts.db_name().unwrap_or("")
    );
    let lock_wait_timeout = lock_wait_timeout(raw.lock_wait_timeout)?;
    Ok(DatabaseSettings {
        url_has_password,
        password_file,
        opts,
        display,
        tls,
        lock_wait_timeout,
    })
}

/// The url parsed, with what the driver would quietly get wrong refused. Never echoes it.
fn parse_url(url: &str) -> Result<mysql_async::Opts, String> {
    check_url_host(url)?;
    check_url_at(url)?;
    let opts =
        mysql_async::Opts::from_url(url).map_err(|e| format!("not a valid mysql:// url: {e}"))?;
    check_url_parts(url, &opts)?;
    Ok(opts)
}

/// mysql_async 0.37.1 recognises a name mismatch by an error text that rustls no longer
/// prints, so it would fail every connection however `verify_identity=false` is set with a
/// verified CA: say so at load.
fn check_tls(opts: &mysql_async::Opts) -> Result<(), String> {
    match opts.ssl_opts() {
        Some(ssl) if ssl.skip_domain_validation() && !ssl.accept_invalid_certs() => Err(
            "verify_identity=false with a verified CA is not supported by this build's TLS \
             driver (it would reject every certificate that does not name the host): use a \
             certificate that names the host, or verify_ca=false"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// `database.lock_wait_timeout`, in the whole seconds the servers count it in.
fn lock_wait_timeout(value: Option<String>) -> Result<u64, KeyError> {
    let wait = duration(value, "15s", "database.lock_wait_timeout")?;
    if wait.subsec_nanos() != 0 || wait > Duration::from_secs(3600) {
        return Err(KeyError::new(
            "database.lock_wait_timeout",
            "must be whole seconds, from 1s to 1h (the servers count it in seconds)".into(),
        ));
    }
    Ok(wait.as_secs())
}

/// Reads a CA file: PEM with at least one certificate. Read here, at load, so that a wrong
/// path is a config error naming the key rather than a failure at every connection.
fn read_ca(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&pem);
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(pem)
}

/// mysql_async quietly falls back to localhost for a url with no host; a config that names
/// no host is more likely a mistake, so it is refused.
fn check_url_host(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("mysql://")
        .ok_or_else(|| "must start with mysql://".to_owned())?;
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.split(':').next().unwrap_or("");
    if host.is_empty() {
        return Err("has no host: mysql://user@host:3306/database".into());
    }
    Ok(())
}

/// What to do with a password or user name a url cannot hold as it is.
const PERCENT_ENCODE: &str = "percent-encode `/` `?` `#` `@` `:` `%` in the user name and \
     password (`/` is %2F, `@` is %40), or move the password to database.password_file";

/// A `@` after the first `/`, `?` or `#` past the scheme while the part before has none: a
/// password (or user name) with one of those in it, which the parse would cut there, taking
/// what follows for the host, the port or the database, and the password for none: it would
/// then be logged as the database's name and sent to the server as one. Refused without
/// echoing the url. (A `@` in a query value after a whole `user:password@host` is the
/// value's own.)
fn check_url_at(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("mysql://").unwrap_or(url);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    if !authority.contains('@') && after.contains('@') {
        return Err(format!(
            "has a `@` after its host: the password or user name holds a character that ends \
             the host part, and would be cut there; {PERCENT_ENCODE}"
        ));
    }
    Ok(())
}

/// The parse kept the password the url's text has (`user:password@`), and left no `@` in the
/// host or the database's name. Never echoes the url.
fn check_url_parts(url: &str, opts: &mysql_async::Opts) -> Result<(), String> {
    let rest = url.strip_prefix("mysql://").unwrap_or(url);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    // `user:@host` is an empty password, which the parse gives as none.
    let has_password = authority
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty());
    if has_password && opts.pass().is_none() {
        return Err(format!(
            "its password was lost in parsing; {PERCENT_ENCODE}"
        ));
    }
    if opts.ip_or_hostname().contains('@') || opts.db_name().is_some_and(|d| d.contains('@')) {
        return Err(format!(
            "leaves a `@` in the host or the database's name: {PERCENT_ENCODE}"
        ));
    }
    Ok(())
}
