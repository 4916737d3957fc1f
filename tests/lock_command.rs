//! `lockstep lock RESOURCE -- COMMAND` against a real lockstep on SQLite:
//! overlapping runs take turns, the command sees its fencing token and
//! resource, its exit status comes back, a held lock is refused at once
//! without `--wait`, a lost lock stops the command, and signals reach it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::json;

use common::{eventually, lockstep_bin, Client, Lockstep};

/// The longest any `lockstep lock` run here may take; every command ends
/// well before (the ones that would not are stopped by the CLI).
const RUN_TIMEOUT: Duration = Duration::from_secs(20);

/// A command trapping SIGTERM: it writes `got-term`, stops its sleep and
/// exits 3. It writes `started` once the trap is in place, and sets the
/// trap only once its sleep's pid is known: a signal before that left the
/// sleep running, holding the output pipes open past the run timeout.
const TRAPS_TERM: &str = "sleep 30 & pid=$!; \
     trap 'echo term > got-term; kill $pid; exit 3' TERM; \
     echo started > started; wait $pid";

/// `lockstep lock ARGS --admin ADMIN -- sh -c SCRIPT`, run in `dir`, without
/// the developer's own `LOCKSTEP_*` variables.
fn lock(admin: &str, args: &[&str], script: &str, dir: &Path) -> tokio::process::Child {
    let mut cmd = tokio::process::Command::new(lockstep_bin());
    cmd.arg("lock")
        .args(args)
        .arg("--admin")
        .arg(admin)
        .arg("--")
        .args(["sh", "-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKSTEP_") {
            cmd.env_remove(key);
        }
    }
    cmd.spawn().expect("cannot run lockstep lock")
}

/// Waits for a run to end; panics if it does not within [`RUN_TIMEOUT`].
async fn finish(child: tokio::process::Child) -> Output {
    tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .expect("lockstep lock did not end")
        .expect("wait for lockstep lock")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn wait_for_file(path: PathBuf) {
    eventually(RUN_TIMEOUT, &format!("{}", path.display()), || {
        let exists = path.exists();
        async move { exists.then_some(()) }
    })
    .await
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("cannot run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// Waits until process `pid` has a SIGTERM handler (Linux: the `SigCgt`
/// mask in /proc/PID/status), so a SIGTERM sent next is its to handle, not
/// the default death of a process still starting.
async fn catches_sigterm(pid: u32) {
    const SIGTERM_BIT: u64 = 1 << (15 - 1);
    eventually(RUN_TIMEOUT, "a SIGTERM handler", || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGTERM_BIT != 0);
        async move { caught.then_some(()) }
    })
    .await
}

/// `GET /locks/{resource}`'s status.
async fn lock_status(ls: &Lockstep, escaped_resource: &str) -> u16 {
    Client::new()
        .get(ls.admin_url_for(&format!("/locks/{escaped_resource}")))
        .send()
        .await
        .status
}

#[tokio::test]
async fn overlapping_runs_take_turns_with_increasing_tokens() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    let script = "echo \"start $LOCKSTEP_FENCING_TOKEN $LOCKSTEP_LOCK_RESOURCE\" >> log; \
                  sleep 1; echo \"end $LOCKSTEP_FENCING_TOKEN\" >> log";
    let first = lock(&ls.admin_url(), &["report/nightly:eu"], script, dir.path());
    wait_for_file(dir.path().join("log")).await;
    let second = lock(
        &ls.admin_url(),
        &["report/nightly:eu", "--wait", "10s"],
        script,
        dir.path(),
    );
    let (first, second) = (finish(first).await, finish(second).await);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));

    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let lines: Vec<Vec<&str>> = log.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 4, "{log}");
    let (t1, t2) = (lines[0][1], lines[2][1]);
    assert_eq!(
        lines,
        vec![
            vec!["start", t1, "report/nightly:eu"],
            vec!["end", t1],
            vec!["start", t2, "report/nightly:eu"],
            vec!["end", t2],
        ],
        "the runs overlapped:\n{log}"
    );
    let (t1, t2): (u64, u64) = (t1.parse().unwrap(), t2.parse().unwrap());
    assert!(t2 > t1, "tokens {t1} then {t2}");
    assert_eq!(lock_status(&ls, "report%2Fnightly:eu").await, 404);
}

#[tokio::test]
async fn the_commands_exit_status_comes_back_and_the_lock_is_released() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    for (script, code) in [("exit 0", 0), ("exit 7", 7), ("kill -KILL $$", 128 + 9)] {
        let out = finish(lock(
            &ls.admin_url(),
            &["job", "--owner", "crón on nöde-1"],
            script,
            dir.path(),
        ))
        .await;
        assert_eq!(out.status.code(), Some(code), "{script}: {}", stderr(&out));
        assert_eq!(lock_status(&ls, "job").await, 404, "{script}");
    }
}

#[tokio::test]
async fn a_held_lock_without_wait_exits_75_and_the_command_never_runs() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    let held = Client::new()
        .post(
            ls.admin_url_for("/locks/job"),
            json!({"owner": "someone-else", "ttl_ms": 60_000}),
        )
        .send()
        .await;
    assert_eq!(held.status, 200, "{held:?}");

    let out = finish(lock(&ls.admin_url(), &["job"], "touch ran", dir.path())).await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("held by another owner"),
        "{}",
        stderr(&out)
    );
    // Waiting, but not long enough, ends the same way.
    let out = finish(lock(
        &ls.admin_url(),
        &["job", "--wait", "300ms"],
        "touch ran",
        dir.path(),
    ))
    .await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(!dir.path().join("ran").exists(), "the command ran");
    // The holder still has it.
    let get = Client::new()
        .get(ls.admin_url_for("/locks/job"))
        .send()
        .await;
    assert_eq!(get.status, 200, "{get:?}");
}

#[tokio::test]
async fn a_signal_while_waiting_ends_the_wait_and_the_command_never_runs() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    let held = Client::new()
        .post(
            ls.admin_url_for("/locks/job"),
            json!({"owner": "someone-else", "ttl_ms": 60_000}),
        )
        .send()
        .await;
    assert_eq!(held.status, 200, "{held:?}");
    let run = lock(
        &ls.admin_url(),
        &["job", "--wait", "1m"],
        "touch ran",
        dir.path(),
    );
    let pid = run.id().expect("running");
    catches_sigterm(pid).await;
    signal(pid, "TERM");

    let out = finish(run).await;
    assert_eq!(out.status.code(), Some(128 + 15), "{}", stderr(&out));
    assert!(!dir.path().join("ran").exists(), "the command ran");
}

#[tokio::test]
async fn a_lock_released_behind_the_commands_back_stops_it_with_sigterm() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    let run = lock(
        &ls.admin_url(),
        &["job", "--owner", "cron-a", "--ttl", "600ms"],
        TRAPS_TERM,
        dir.path(),
    );
    wait_for_file(dir.path().join("started")).await;
    // Someone who knows the owner gives the lock away; the next renewal
    // finds it gone.
    let released = Client::new()
        .delete(ls.admin_url_for("/locks/job"))
        .header("lock-owner", "cron-a")
        .send()
        .await;
    assert_eq!(released.status, 204, "{released:?}");

    let out = finish(run).await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(dir.path().join("got-term").exists(), "no SIGTERM");
    assert!(stderr(&out).contains("lost the lock"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_lock_that_cannot_be_renewed_within_its_ttl_stops_the_command() {
    let mut ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    let run = lock(
        &ls.admin_url(),
        &["job", "--ttl", "300ms"],
        TRAPS_TERM,
        dir.path(),
    );
    wait_for_file(dir.path().join("started")).await;
    // No lockstep answers any more: past the TTL the lock may be anyone's.
    ls.kill();

    let out = finish(run).await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(dir.path().join("got-term").exists(), "no SIGTERM");
    assert!(stderr(&out).contains("within its TTL"), "{}", stderr(&out));
}

/// A TCP relay to `target` that can be cut: then it refuses new
/// connections and drops the open ones, as a network partition would.
struct Relay {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn to(target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut pipes = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                pipes.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Relay { addr, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops the listener and every open pipe (the JoinSet aborts its
    /// tasks when dropped with the accept loop).
    fn cut(&self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_command_cut_off_from_lockstep_is_gone_before_another_machine_can_take_the_lock() {
    let ls = Lockstep::builder().start();
    let relay = Relay::to(ls.admin_addr()).await;
    let dir = tempfile::tempdir().unwrap();
    // --kill-after stays at its 10 s default: longer than the TTL.
    let mut run = lock(
        &relay.url(),
        &["job", "--owner", "cron-a", "--ttl", "900ms"],
        TRAPS_TERM,
        dir.path(),
    );
    wait_for_file(dir.path().join("started")).await;
    relay.cut();

    // Another machine, which still reaches lockstep, takes the lock the
    // moment it lapses; by then this run must be over.
    let client = Client::new();
    let taken = eventually(RUN_TIMEOUT, "the lock lapsing", || {
        let client = &client;
        let url = ls.admin_url_for("/locks/job");
        async move {
            let resp = client
                .post(url, json!({"owner": "cron-b", "ttl_ms": 60_000}))
                .send()
                .await;
            (resp.status == 200).then_some(())
        }
    });
    taken.await;
    let exited = run.try_wait().unwrap();
    assert!(
        exited.is_some(),
        "COMMAND's lockstep lock still ran when another owner got the lock"
    );
    assert!(dir.path().join("got-term").exists(), "no SIGTERM");
    let out = finish(run).await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("within its TTL"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_command_ignoring_sigterm_gets_sigkill_after_kill_after() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    // `exec` keeps the ignored SIGTERM: the sleep itself is COMMAND.
    let run = lock(
        &ls.admin_url(),
        &[
            "job",
            "--owner",
            "cron-a",
            "--ttl",
            "600ms",
            "--kill-after",
            "500ms",
        ],
        "trap '' TERM; echo started > started; exec sleep 60",
        dir.path(),
    );
    wait_for_file(dir.path().join("started")).await;
    let released = Client::new()
        .delete(ls.admin_url_for("/locks/job"))
        .header("lock-owner", "cron-a")
        .send()
        .await;
    assert_eq!(released.status, 204, "{released:?}");

    // Ends long before the sleep would.
    let out = finish(run).await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("SIGKILL"), "{}", stderr(&out));
}

#[tokio::test]
async fn sigterm_and_sigint_reach_the_command_and_the_lock_is_released() {
    let ls = Lockstep::builder().start();
    // SIGQUIT and SIGUSR1 too: their default action would end `lockstep
    // lock` and leave COMMAND running with nobody renewing its lock.
    for sig in ["TERM", "INT", "QUIT", "USR1"] {
        let dir = tempfile::tempdir().unwrap();
        let script = TRAPS_TERM.replace("TERM;", &format!("{sig};"));
        let run = lock(&ls.admin_url(), &["job"], &script, dir.path());
        wait_for_file(dir.path().join("started")).await;
        assert_eq!(
            lock_status(&ls, "job").await,
            200,
            "{sig}: held while running"
        );
        signal(run.id().expect("running"), sig);

        let out = finish(run).await;
        assert_eq!(out.status.code(), Some(3), "{sig}: {}", stderr(&out));
        assert!(dir.path().join("got-term").exists(), "{sig} not forwarded");
        assert_eq!(lock_status(&ls, "job").await, 404, "{sig}: not released");
    }
}

#[tokio::test]
async fn usage_errors_exit_64_and_an_unreachable_admin_75() {
    let ls = Lockstep::builder().start();
    let dir = tempfile::tempdir().unwrap();
    let admin = ls.admin_url();
    for (args, why) in [
        (vec!["job", "--ttl", "30"], "a duration without a unit"),
        (vec!["job", "--wait", "soon"], "not a duration"),
        (vec!["", "--ttl", "1s"], "an empty resource"),
        (
            vec!["job", "--token-file", "/nonexistent/token"],
            "no token file",
        ),
        (vec!["job", "--ttl", "50ms"], "a TTL below locks.min_ttl_ms"),
    ] {
        let out = finish(lock(&admin, &args, "touch ran", dir.path())).await;
        assert_eq!(out.status.code(), Some(64), "{why}: {}", stderr(&out));
    }
    // No COMMAND at all.
    let out = tokio::process::Command::new(lockstep_bin())
        .args(["lock", "job", "--admin", &admin])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));

    let out = finish(lock(
        "http://127.0.0.1:1",
        &["job"],
        "touch ran",
        dir.path(),
    ))
    .await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(!dir.path().join("ran").exists(), "the command ran");

    // A command that does not exist: 127, and the lock is given back.
    let out = tokio::process::Command::new(lockstep_bin())
        .args([
            "lock",
            "job",
            "--admin",
            &admin,
            "--",
            "/nonexistent/command",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert_eq!(lock_status(&ls, "job").await, 404);
}

#[tokio::test]
async fn with_a_token_file_the_cli_gets_past_the_lock_apis_bearer_check() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# lock API callers\ns3cret-token-for-cron\n").unwrap();
    let ls = Lockstep::builder()
        .locks_toml(&format!(
            "api_tokens_file = {}",
            common::toml_string(tokens.to_str().unwrap())
        ))
        .start();
    let client_token = dir.path().join("client-token");
    // The server's token file format: comments and blank lines aside.
    std::fs::write(
        &client_token,
        "# the cron job's token\n\n  s3cret-token-for-cron  \n",
    )
    .unwrap();

    // Without the token the server refuses, and the command never runs.
    let refused = finish(lock(
        &ls.admin_url(),
        &["cron/tokens"],
        "echo ran > ran",
        dir.path(),
    ))
    .await;
    assert_ne!(refused.status.code(), Some(0), "{}", stderr(&refused));
    assert!(!dir.path().join("ran").exists(), "ran without a token");

    let out = finish(lock(
        &ls.admin_url(),
        &[
            "cron/tokens",
            "--token-file",
            client_token.to_str().unwrap(),
        ],
        "echo \"$LOCKSTEP_FENCING_TOKEN\" > ran",
        dir.path(),
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let token = std::fs::read_to_string(dir.path().join("ran")).unwrap();
    assert!(token.trim().parse::<u64>().is_ok(), "{token:?}");
    // Released on exit: with the token, the lock is gone.
    let gone = Client::new()
        .with_bearer("s3cret-token-for-cron")
        .get(ls.admin_url_for("/locks/cron%2Ftokens"))
        .send()
        .await;
    assert_eq!(gone.status, 404, "{gone:?}");
}
