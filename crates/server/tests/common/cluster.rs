//! Pieces of a small cluster on loopback: `gantry serve` replicas that can be killed and
//! restarted on the same port and data directory, and nginx in front of them.
#![allow(unsafe_code, reason = "kill(2) of the test's own child replicas through libc")]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::gantry;

/// A port free now and outside the kernel's ephemeral range, for servers a test stops and
/// starts again on the same port. A port from the ephemeral range (what binding port 0 gives) can
/// be taken meanwhile by any outgoing connection's local end (the suite opens hundreds), and a
/// listener cannot bind it then: PostgreSQL failed to start that way. Each call in a process gets
/// another port; processes start from their pid, so concurrent test binaries rarely meet, and a
/// port something listens on is skipped.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = ephemeral_range_start().saturating_sub(1).max(20_001);
    let span = low - 20_000;
    let start = std::process::id() * 97;
    loop {
        let port = (20_000 + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The first port of `/proc/sys/net/ipv4/ip_local_port_range` (32768 unless tuned).
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// One `gantry serve` process with a fixed name, port and data directory, so a restart is the
/// same replica again (its outbox replays, its instance id's reservations are its own).
pub(crate) struct Replica {
    pub name: String,
    pub port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Replica {
    pub(crate) fn new(name: &str, dir: &Path, args: &[String]) -> Self {
        let data_dir = dir.join(name);
        std::fs::create_dir_all(&data_dir).unwrap();
        let log = dir.join(format!("{name}.log"));
        Self { name: name.into(), port: free_port(), data_dir, log, args: args.to_vec(), child: None }
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(crate) fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is running", self.name);
        let log = File::options().create(true).append(true).open(&self.log).unwrap();
        let child = gantry()
            .args(["serve", "--host", "127.0.0.1", "--port", &self.port.to_string(), "--instance-id", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            .env_remove("GANTRY_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gantry");
        self.child = Some(child);
    }

    /// Waits until `/health/ready` answers 200.
    pub(crate) async fn wait_ready(&self) {
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ok = client
                .get(format!("http://{}/health/ready", self.addr()))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "{} never became ready; its log:\n{}", self.name, self.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn sigterm(&self) {
        let child = self.child.as_ref().expect("running");
        // SAFETY: kill(2) on the pid of a child this value owns and has not waited for.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }

    /// Waits for the process to exit (after [`Self::sigterm`]) and returns its status.
    pub(crate) async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.as_mut().expect("running").try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit; its log:\n{}", self.name, self.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// Starts one replica per name with the same `args`, all at once, and waits until each is ready.
pub(crate) async fn start_replicas(names: &[&str], dir: &Path, args: &[&str]) -> Vec<Replica> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut replicas: Vec<Replica> = names.iter().map(|n| Replica::new(n, dir, &args)).collect();
    for r in &mut replicas {
        r.spawn();
    }
    for r in &replicas {
        r.wait_ready().await;
    }
    replicas
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// nginx from the system's packages, when installed.
pub(crate) fn nginx_binary() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"].iter().map(PathBuf::from).find(|p| p.is_file())
}

/// nginx balancing over `upstreams` on its own port, as an operator would put it in front of
/// replicas: least connections, SSE unbuffered, and a request retried on another replica only
/// when the one it went to gave no answer (refused the connection, or died before the response
/// head) or answered 503 (draining, overloaded, database unreachable: never admitted, so
/// nothing was billed for it). `max_fails=0`: a replica is never marked down, since a 503
/// while the database restarts would otherwise take every replica out at once ("no live
/// upstreams"); a dead one costs a refused connection per try. Each answer names the replica in
/// `X-Gantry-Upstream`.
pub(crate) struct Nginx {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

/// How nginx picks a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Balance {
    LeastConnections,
    /// Consistent hashing of the `x-session-id` header, so one conversation keeps going to the
    /// replica that holds its prefix in its KV cache; requests without one are spread by their
    /// own random request id.
    SessionAffinity,
}

impl Nginx {
    pub(crate) fn start(binary: &Path, dir: &Path, upstreams: &[String], balance: Balance) -> Self {
        let port = free_port();
        let dir = dir.join(format!("nginx-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        // Workers run as `nobody` when started as root: they must be able to use the temp dirs.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let servers: String = upstreams.iter().map(|u| format!("    server {u} max_fails=0;\n")).collect();
        let (map, method) = match balance {
            Balance::LeastConnections => ("", "least_conn;"),
            Balance::SessionAffinity => (
                "  map $http_x_session_id $affinity_key { \"\" $request_id; default $http_x_session_id; }\n",
                "hash $affinity_key consistent;",
            ),
        };
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             {map}  upstream gantry {{\n    {method}\n{servers}  }}\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://gantry;\n\
             proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
             proxy_connect_timeout 2s;\n      proxy_read_timeout 120s;\n\
             proxy_next_upstream error timeout http_503 non_idempotent;\n      proxy_next_upstream_tries 3;\n\
             add_header X-Gantry-Upstream $upstream_addr always;\n    }}\n  }}\n}}\n"
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn nginx");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}",
                std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port, dir }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child this value owns and has not waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
