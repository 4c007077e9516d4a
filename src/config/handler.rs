//! Where a queue's handler is found, and what it is given: the program named by `command`,
//! looked for on PATH as `execvp` would, and the variables `pass_env` may name.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The PATH a handler gets when myjob itself has none, and where a handler's bare command name
/// is looked for then.
pub const HANDLER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `command = ["myjob:noop"]` runs no process: compiled in only with the `bench` feature, so the
/// benchmark can measure the queue without the cost of a spawn.
#[cfg(feature = "bench")]
pub const NOOP_HANDLER: &str = "myjob:noop";

/// A `pass_env` name: a variable name, and not one of myjob's own.
pub(super) fn check_pass_env(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!("{name:?} is not a variable name"));
    }
    // The database url may carry the password, and MYJOB_* is what myjob sets itself.
    if name.starts_with("MYJOB_") {
        return Err(format!("{name} is myjob's own and is never passed on"));
    }
    Ok(())
}

/// The PATH a handler gets: myjob's own, or [`HANDLER_PATH`] when myjob has none.
pub fn handler_path() -> OsString {
    std::env::var_os("PATH").unwrap_or_else(|| OsString::from(HANDLER_PATH))
}

/// Where a program named without a slash is found on `search`, as `execvp` would find it: the
/// first directory that holds an executable file of that name (an empty entry is the
/// working directory, as for `execvp`). Handlers are started from the path found: when the
/// child's environment sets PATH, the standard library forks the whole worker (its page
/// tables, its threads' stacks) to search PATH in the child, but it starts a path directly
/// with `posix_spawn`, which costs the worker a third of the CPU (per `cat` job, 200 µs
/// against 650).
///
/// A file counts when this user may run it (`access`), as `execvp` goes on past one it may
/// not; an empty entry is the working directory, as a `./` path so that the start stays a
/// spawn.
pub fn find_on_path(program: &str, search: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(search)
        .map(|dir| match dir.as_os_str().is_empty() {
            true => Path::new(".").join(program),
            false => dir.join(program),
        })
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file())
                && nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok()
        })
}

/// The handler must be a file that myjob can execute: named by path, or found on PATH.
pub(super) fn check_executable(program: &str) -> Result<(), String> {
    #[cfg(feature = "bench")]
    if program == NOOP_HANDLER {
        return Ok(());
    }
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        find_on_path(program, &handler_path())
            .ok_or_else(|| format!("{program} is not found on PATH"))?
    };
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    if meta.permissions().mode() & 0o111 == 0
        || nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK).is_err()
    {
        return Err(format!("{} is not executable", path.display()));
    }
    Ok(())
}
