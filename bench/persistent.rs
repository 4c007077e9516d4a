//! Item 9: persistent handlers against a process per job, and a minimal one against the
//! no-op core; and the minimal persistent handler itself, which this binary becomes with
//! [`PERSISTENT_OK`].

use std::path::Path;

use crate::harness::{mark, Bench, Handler};

/// The argument that makes this binary a minimal persistent handler (see [`serve_ok`]).
pub(crate) const PERSISTENT_OK: &str = "--persistent-ok";

impl Handler {
    /// This binary as a minimal persistent handler (see [`serve_ok`]).
    pub(crate) fn minimal_persistent() -> Handler {
        Handler {
            argv: vec![
                std::env::current_exe()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned(),
                PERSISTENT_OK.to_owned(),
            ],
            persistent: true,
            jobs: None,
            other_queues: 0,
        }
    }
}

impl Bench {
    /// Item 9, persistent handlers: the same PHP handler body per job and persistent, the
    /// same for Python, a minimal persistent handler (this binary with [`PERSISTENT_OK`])
    /// against the no-op handler, which runs no process, and myjob's peak RSS with
    /// persistent handlers at concurrency 64. All at concurrency 8 but the last. Per-job
    /// interpreters are slow, so their runs take fewer jobs.
    pub(crate) async fn persistent(&mut self, spawn: f64) {
        let smoke = self.size.jobs < 1000;
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/persistent");
        let dir = self.dir.clone();
        let put = |name: &str, text: &str| {
            let path = dir.join(name);
            let text = text
                .replace("DIR", dir.to_str().unwrap())
                .replace("EXAMPLES", examples.to_str().unwrap());
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        // The body: a SHA-256 of the payload.
        put(
            "body.php",
            "<?php\nfunction body(string $p): void { if (strlen(hash('sha256', $p)) !== 64) { throw new RuntimeException('hash'); } }\n",
        );
        let php_job = put(
            "per-job.php",
            "<?php\nrequire 'DIR/body.php';\nbody(stream_get_contents(STDIN));\n",
        );
        let php_persistent = put(
            "persistent.php",
            "<?php\nrequire 'DIR/body.php';\nrequire 'EXAMPLES/myjob.php';\nmyjob_serve(fn (MyjobJob $job) => body($job->payload));\n",
        );
        put(
            "body.py",
            "import hashlib\n\ndef body(p):\n    if len(hashlib.sha256(p).hexdigest()) != 64:\n        raise ValueError('hash')\n",
        );
        let py_job = put(
            "per_job.py",
            "import sys\nsys.path.insert(0, 'DIR')\nimport body\nbody.body(sys.stdin.buffer.read())\n",
        );
        let py_persistent = put(
            "persistent.py",
            "import sys\nsys.path[:0] = ['DIR', 'EXAMPLES']\nimport body, myjob\nmyjob.serve(lambda job: body.body(job.payload))\n",
        );
        // The system's interpreter, not a version manager's shim, which would add a shell
        // start to every per-job run.
        let python = if Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        let (few, many) = if smoke { (10, 200) } else { (200, 10_000) };
        for (name, interpreter, per_job, persistent, per_job_jobs) in [
            ("PHP", "php", php_job, php_persistent, 2 * few),
            ("Python", python, py_job, py_persistent, few),
        ] {
            let handler = |script: String, persistent: bool, jobs: usize| Handler {
                argv: vec![interpreter.to_owned(), script],
                persistent,
                jobs: Some(jobs),
                other_queues: 0,
            };
            let slow = self
                .throughput(1, 8, handler(per_job, false, per_job_jobs), 0)
                .await
                .rate;
            let fast = self
                .throughput(1, 8, handler(persistent, true, many), 0)
                .await
                .rate;
            self.line(&format!(
                "| {name} handler (SHA-256 of the payload), a process per job, concurrency 8, jobs/s | {slow:.0} | 1 | |"
            ));
            self.line(&format!(
                "| the same {name} body, persistent (examples/persistent), jobs/s | {fast:.0} | {:.1} of per-job | ≥ 20 {} |",
                fast / slow,
                mark(fast / slow >= 20.0)
            ));
        }
        let ok = Handler::minimal_persistent();
        let noop = self.throughput(1, 8, "myjob:noop", 0).await.rate;
        let minimal = self.throughput(1, 8, ok.clone(), 0).await.rate;
        self.line(&format!(
            "| minimal persistent handler (reads the payload, answers OK), concurrency 8, jobs/s | {minimal:.0} | {:.2} of no-op ({noop:.0}) | ≥ 0.50 {} |",
            minimal / noop,
            mark(minimal / noop >= 0.5)
        ));
        self.line(&format!(
            "| the same, over the `cat` spawn ceiling | | {:.1} of spawn | |",
            minimal / spawn
        ));
        let run = self.throughput(1, 64, ok, 0).await;
        self.line(&format!(
            "| peak RSS of `myjob run`, concurrency 64, persistent handlers, MiB | {:.1} | | ≤ 20 {} |",
            run.peak_kib as f64 / 1024.0,
            mark(run.peak_kib <= 20 * 1024)
        ));
    }
}

/// A minimal persistent handler: `READY`, then for each job its header and whole payload read,
/// and `OK`. What a handler costs when it does nothing.
pub(crate) fn serve_ok() {
    use std::io::{BufRead, Read, Write};
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let mut header = String::new();
    let mut payload = Vec::new();
    if out
        .write_all(b"READY\n")
        .and_then(|()| out.flush())
        .is_err()
    {
        return;
    }
    loop {
        header.clear();
        if !matches!(input.read_line(&mut header), Ok(n) if n > 0) {
            return; // EOF: myjob wants this process to exit
        }
        let length: u64 = header
            .trim_end()
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        payload.clear();
        if (&mut input).take(length).read_to_end(&mut payload).is_err()
            || out.write_all(b"OK\n").and_then(|()| out.flush()).is_err()
        {
            return;
        }
    }
}
