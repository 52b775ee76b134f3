//! A throwaway PostgreSQL cluster of a test's own, so the test can stop and start it.
#![allow(unsafe_code, reason = "geteuid(2) through libc, to run PostgreSQL as another user when root")]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Stopped (immediately, as a crash) and removed when dropped.
pub(crate) struct OwnPostgres {
    dir: PathBuf,
    port: u16,
}

impl OwnPostgres {
    pub(crate) fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-postgres.sh")
    }

    pub(crate) fn start(dir: &Path, port: u16) -> Self {
        let pg = Self { dir: dir.to_path_buf(), port };
        pg.run();
        pg
    }

    /// Starts the cluster (initialising it the first time).
    pub(crate) fn run(&self) {
        let out = Command::new(Self::script())
            .env("GANTRY_TEST_PG_PORT", self.port.to_string())
            .env("GANTRY_TEST_PG_DIR", &self.dir)
            .output()
            .unwrap();
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let log_tail: Vec<&str> = log.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
        assert!(
            out.status.success(),
            "starting PostgreSQL on port {}: {}\nits log:\n{}",
            self.port,
            String::from_utf8_lossy(&out.stderr),
            log_tail.join("\n")
        );
    }

    pub(crate) fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub(crate) fn stop(&self) {
        let out = self.pg_ctl_stop();
        assert!(out.status.success(), "stopping PostgreSQL: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub(crate) fn pg_ctl_stop(&self) -> std::process::Output {
        let pg_ctl = std::fs::read_dir("/usr/lib/postgresql")
            .unwrap()
            .map(|e| e.unwrap().path().join("bin/pg_ctl"))
            .find(|p| p.is_file())
            .expect("pg_ctl");
        // SAFETY: geteuid(2) takes nothing and cannot fail.
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
            c
        } else {
            Command::new(&pg_ctl)
        };
        cmd.arg("-D").arg(&self.dir).args(["-m", "immediate", "-w", "stop"]).output().unwrap()
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.pg_ctl_stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
