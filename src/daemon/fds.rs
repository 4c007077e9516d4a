//! File descriptors myjob inherited from whoever started it. A parent that forgot FD_CLOEXEC
//! (a shell's `7>file`, a supervisor's pipe) would otherwise pass them on to every handler and
//! to the guard: a handler could write to them, and a pipe held open by a handler never sees
//! its EOF. [`close_on_exec_inherited`] marks every descriptor above stderr close-on-exec, first
//! thing in `main`, while myjob has one thread; myjob itself can still use them.

use std::os::fd::{BorrowedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::libc;

/// How the descriptors were marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// `close_range(3, ~0U, CLOSE_RANGE_CLOEXEC)`: one system call (Linux 5.11 and later).
    CloseRange,
    /// One `fcntl` per descriptor listed in /proc/self/fd: older kernels, or a seccomp
    /// filter that refuses close_range.
    ProcSelfFd,
    /// Neither worked (no /proc): nothing was changed.
    Nothing,
}

/// Marks every descriptor above 2 close-on-exec. Never fails: the worker runs without it
/// rather than not at all. Call it before any thread starts, so that no descriptor is opened
/// (or closed) while it runs.
pub fn close_on_exec_inherited() -> Marked {
    match close_range_cloexec() {
        Ok(()) => Marked::CloseRange,
        Err(_) => match mark_listed() {
            Ok(()) => Marked::ProcSelfFd,
            Err(_) => Marked::Nothing,
        },
    }
}

/// The close_range system call with CLOSE_RANGE_CLOEXEC: ENOSYS on kernels before 5.9,
/// EINVAL for the flag on kernels before 5.11.
fn close_range_cloexec() -> Result<(), Errno> {
    // SAFETY: close_range only changes the flags of this process's descriptors; it reads and
    // writes no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    Errno::result(r).map(drop)
}

/// Sets FD_CLOEXEC on each descriptor above 2 that /proc/self/fd lists. The directory's own
/// descriptor is among them, closed by the time it is reached: its EBADF is ignored, as is any
/// other error on one descriptor.
fn mark_listed() -> std::io::Result<()> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: the descriptor is only borrowed for the two calls below, and no other
        // thread can close it meanwhile (there is none yet; if it was closed, fcntl says EBADF).
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(bits) = fcntl(borrowed, FcntlArg::F_GETFD) else {
            continue;
        };
        let flags = FdFlag::from_bits_retain(bits);
        if !flags.contains(FdFlag::FD_CLOEXEC) {
            let _ = fcntl(borrowed, FcntlArg::F_SETFD(flags | FdFlag::FD_CLOEXEC));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    /// A descriptor without FD_CLOEXEC, as an inherited one would be.
    fn inheritable() -> std::fs::File {
        let file = tempfile::tempfile().unwrap();
        fcntl(file.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())).unwrap();
        assert!(!cloexec(&file));
        file
    }

    fn cloexec(file: &std::fs::File) -> bool {
        let bits = fcntl(file.as_fd(), FcntlArg::F_GETFD).unwrap();
        FdFlag::from_bits_retain(bits).contains(FdFlag::FD_CLOEXEC)
    }

    fn stdio_flags() -> Vec<i32> {
        (0..3)
            // SAFETY: stdin, stdout and stderr stay open for the whole test binary.
            .map(|fd| fcntl(unsafe { BorrowedFd::borrow_raw(fd) }, FcntlArg::F_GETFD).unwrap_or(-1))
            .collect()
    }

    #[test]
    fn every_descriptor_above_stderr_is_marked_and_stdio_is_left_alone() {
        let before = stdio_flags();
        let file = inheritable();
        assert!(file.as_raw_fd() > 2);
        let how = close_on_exec_inherited();
        assert_ne!(how, Marked::Nothing);
        assert!(cloexec(&file), "{how:?}");
        assert_eq!(stdio_flags(), before);
    }

    #[test]
    fn the_fallback_marks_what_proc_lists() {
        let file = inheritable();
        mark_listed().unwrap();
        assert!(cloexec(&file));
    }
}
