//! Where log lines go: stderr, written at once when nothing else is being
//! written, and in batches, by a thread of its own, when something is.
//!
//! Why: with the access log on (the default) every proxied request logs a
//! line, and a write(2) per line on the request path cost about 1 µs of the
//! 20 a passthrough request takes, and stalled a worker whenever another
//! worker's write was in the way. Why not a log thread for every line
//! (`tracing-appender`'s non-blocking writer, or a thread that waits a
//! moment for more lines, as nginx's `access_log … buffer= flush=`): a line
//! would then reach stderr a moment after the response it describes, so
//! whoever reads the log right after an answer (a test, an operator's
//! `curl` then `kubectl logs`) could miss it; and a wake-up per line cost
//! lock pairs 3% more CPU than writing directly.
//!
//! So a line that finds nothing pending and nothing being written is
//! written by the thread that logs it, before the logging call returns, as
//! a plain write to stderr would be. A line that finds a write in progress
//! is appended to a shared buffer (a copy under a mutex, no system call),
//! and the `lockstep-log` thread writes everything gathered there in one
//! call as soon as the write in progress ends. Lines stay in the order they
//! were logged: a line is only written directly when no earlier one is
//! pending or being written.
//!
//! Lossless, with bounded memory: when [`MAX_PENDING`] bytes are waiting
//! (stderr is slow, say a full pipe), a logging thread waits for room, as it
//! waited for stderr before. What is pending at a SIGKILL or an abort is
//! lost (under load, the lines of the last write or so); [`FlushGuard`]
//! writes it out on an orderly exit. Once the thread has ended, lines are
//! written directly, still in order.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// Past this many bytes pending, logging threads wait for room.
const MAX_PENDING: usize = 1024 * 1024;
/// A buffer that grew past this in a burst is given back afterwards.
const KEEP_CAPACITY: usize = 64 * 1024;

struct Pending {
    bytes: Vec<u8>,
    /// A write to `out` is in progress (by the thread, or by a logger
    /// writing its own line): lines wait in `bytes` until it ends.
    writing: bool,
    /// Set by the guard: write what is pending and stop.
    stop: bool,
    /// Set, under the lock, by the thread as it ends (or when none could
    /// be started): from then on whoever logs writes to stderr directly,
    /// holding the lock, so no line overtakes one still pending.
    done: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    /// The writer thread waits on it for lines, for a write to end, or for
    /// a stop.
    lines: Condvar,
    /// Logging threads wait on it for room below `MAX_PENDING`.
    room: Condvar,
    /// Where lines go. Only whoever set `writing` uses it, so its lock is
    /// never contended; it only makes sharing it safe.
    out: Mutex<Box<dyn Write + Send>>,
}

impl Shared {
    /// A panic while the lock was held (none can: only appends, swaps and
    /// flags run under it) leaves the buffer whole, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes one formatted event: at once when nothing earlier is pending
    /// or being written, else queued for the thread.
    fn write_line(&self, buf: &[u8]) -> std::io::Result<()> {
        let mut pending = self.lock();
        while pending.bytes.len() >= MAX_PENDING && !pending.done {
            pending = self
                .room
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if pending.done {
            // The thread has ended (the process is ending) or none could be
            // started: write directly, under the lock, in order.
            return std::io::stderr().write_all(buf);
        }
        if !pending.writing && pending.bytes.is_empty() {
            // Nothing earlier is pending or being written: this line goes
            // out now, before the logging call returns.
            pending.writing = true;
            drop(pending);
            let writing = Writing(self);
            self.write_out(buf);
            drop(writing);
            return Ok(());
        }
        let was_empty = pending.bytes.is_empty();
        pending.bytes.extend_from_slice(buf);
        drop(pending);
        // A notify is a system call: only for the first line pending (the
        // thread then finds the rest with it).
        if was_empty {
            self.lines.notify_one();
        }
        Ok(())
    }

    /// Writes `bytes` to `out`; the caller has set `writing`. A failed
    /// write (stderr closed) drops them: there is nowhere left to say so.
    fn write_out(&self, bytes: &[u8]) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = out.write_all(bytes).and_then(|()| out.flush());
    }
}

/// Clears `writing` when a write ends, however it ends, and wakes the
/// thread if lines gathered meanwhile (or it is asked to stop).
struct Writing<'a>(&'a Shared);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        pending.writing = false;
        let wake = !pending.bytes.is_empty() || pending.stop;
        drop(pending);
        if wake {
            self.0.lines.notify_one();
        }
    }
}

/// The `MakeWriter` handed to the tracing subscriber (and a writer itself):
/// each write is one formatted event.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Writes what is pending and stops the thread when dropped. Keep it until
/// the process ends.
#[must_use = "dropping the guard ends the log thread at once: keep it until the process ends"]
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the thread that writes to `out` and returns the writer that feeds
/// it, with its guard. Once the guard is dropped, or if no thread can be
/// started, lines are written to stderr directly by whoever logs.
pub fn spawn<W: Write + Send + 'static>(out: W) -> (BatchWriter, FlushGuard) {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending {
            bytes: Vec::with_capacity(KEEP_CAPACITY),
            writing: false,
            stop: false,
            done: false,
        }),
        lines: Condvar::new(),
        room: Condvar::new(),
        out: Mutex::new(Box::new(out)),
    });
    let thread_shared = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("lockstep-log".into())
        .spawn(move || write_loop(&thread_shared))
        .ok();
    if thread.is_none() {
        let mut pending = shared.lock();
        pending.stop = true;
        pending.done = true;
        drop(pending);
        eprintln!("lockstep: no log thread could be started; log lines are written directly");
    }
    let writer = BatchWriter {
        shared: Arc::clone(&shared),
    };
    (writer, FlushGuard { shared, thread })
}

/// Marks the thread done however it ends, a panic in `out` included, so
/// that no logger waits for room that will never come; what is still
/// pending then goes to stderr.
struct Ending<'a>(&'a Shared);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        if !pending.done {
            pending.stop = true;
            pending.done = true;
            let rest = std::mem::take(&mut pending.bytes);
            let _ = std::io::stderr().write_all(&rest);
        }
        drop(pending);
        self.0.room.notify_all();
    }
}

fn write_loop(shared: &Shared) {
    let _ending = Ending(shared);
    let mut spare = Vec::with_capacity(KEEP_CAPACITY);
    loop {
        let mut pending = shared.lock();
        loop {
            if !pending.writing {
                if !pending.bytes.is_empty() {
                    break;
                }
                if pending.stop {
                    pending.done = true;
                    return;
                }
            }
            pending = shared
                .lines
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
        pending.writing = true;
        std::mem::swap(&mut pending.bytes, &mut spare);
        drop(pending);
        // Loggers wait for room only at the bound; a notify is a system call.
        if spare.len() >= MAX_PENDING {
            shared.room.notify_all();
        }
        let writing = Writing(shared);
        shared.write_out(&spare);
        drop(writing);
        spare.clear();
        if spare.capacity() > KEEP_CAPACITY {
            spare.shrink_to(KEEP_CAPACITY);
        }
    }
}

impl std::io::Write for BatchWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.shared.write_line(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the subscriber writes one event through: a borrow of the shared
/// state, so no reference count is touched per line.
pub struct LineWriter<'a>(&'a Shared);

impl std::io::Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_line(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_line(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(&self.shared)
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.lock().stop = true;
        self.shared.lines.notify_one();
        self.shared.room.notify_all();
        // The thread writes what is pending and ends.
        let _ = thread.join();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use std::thread::JoinHandle;

    use super::{spawn, BatchWriter, Pending, Writing, MAX_PENDING};

    /// Polls the writer's state until `ready` holds; fails after 5 s.
    fn wait_until(writer: &BatchWriter, what: &str, ready: impl Fn(&Pending) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ready(&writer.shared.lock()) {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A stderr stand-in: what was written, and a gate that, while shut,
    /// holds every write (a reader that stopped reading its pipe).
    #[derive(Clone, Default)]
    struct Sink {
        written: Arc<Mutex<Vec<u8>>>,
        gate: Arc<(Mutex<bool>, std::sync::Condvar)>,
    }

    impl Sink {
        fn shut() -> Sink {
            let sink = Sink::default();
            *sink.gate.0.lock().unwrap() = true;
            sink
        }
        fn open(&self) {
            *self.gate.0.lock().unwrap() = false;
            self.gate.1.notify_all();
        }
        fn text(&self) -> String {
            String::from_utf8(self.written.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut shut = self.gate.0.lock().unwrap();
            while *shut {
                shut = self.gate.1.wait(shut).unwrap();
            }
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Reopen(Sink);

    impl Drop for Reopen {
        fn drop(&mut self) {
            self.0.open();
        }
    }

    #[test]
    fn lines_from_many_threads_arrive_whole_once_and_in_each_threads_order() {
        let sink = Sink::default();
        let (writer, guard) = spawn(sink.clone());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let mut writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        writer
                            .write_all(
                                format!("t{t} line {i} {}\n", "x".repeat(i % 300)).as_bytes(),
                            )
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = sink.text();
        let mut next = [0usize; 8];
        for line in text.lines() {
            let mut parts = line.split(' ');
            let t: usize = parts.next().unwrap()[1..].parse().unwrap();
            assert_eq!(parts.next(), Some("line"), "{line}");
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(parts.next(), Some("x".repeat(i % 300).as_str()), "{line}");
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [2000; 8], "every line once");
    }

    /// Runs `log` on a thread of its own and waits until it is writing
    /// (held at a shut gate): from then on, lines are queued.
    fn hold_a_write(writer: &BatchWriter, log: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
        let holder = std::thread::spawn(log);
        wait_until(writer, "the first line was never written", |p| p.writing);
        holder
    }

    #[test]
    fn a_line_with_nothing_pending_is_out_before_the_call_returns_and_the_guard_writes_the_rest() {
        let sink = Sink::default();
        let (mut writer, guard) = spawn(sink.clone());
        writer.write_all(b"alone\n").unwrap();
        assert_eq!(sink.text(), "alone\n", "written before write_all returned");
        // Queued behind a write in progress that ends without waking the
        // thread: the guard still writes it out.
        writer.shared.lock().writing = true;
        writer.write_all(b"last\n").unwrap();
        writer.shared.lock().writing = false;
        drop(guard);
        assert_eq!(sink.text(), "alone\nlast\n");
    }

    #[test]
    fn lines_logged_during_a_write_follow_it_even_while_the_guard_stops_the_thread() {
        let sink = Sink::shut();
        let (writer, guard) = spawn(sink.clone());
        let _reopen = Reopen(sink.clone());
        let mut first = writer.clone();
        let holder = hold_a_write(&writer, move || first.write_all(b"0\n").unwrap());
        let mut writer = writer;
        for i in 1..100 {
            writer.write_all(format!("{i}\n").as_bytes()).unwrap();
        }
        // The guard's drop waits for the thread, which waits for the write.
        let stopping = std::thread::spawn(move || drop(guard));
        wait_until(&writer, "the guard never stopped the thread", |p| p.stop);
        for i in 100..200 {
            writer.write_all(format!("{i}\n").as_bytes()).unwrap();
        }
        sink.open();
        holder.join().unwrap();
        stopping.join().unwrap();
        let expected: String = (0..200).map(|i| format!("{i}\n")).collect();
        assert_eq!(sink.text(), expected);
    }

    /// A stand-in for a stderr whose write panics.
    struct Panics;

    impl Write for Panics {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            panic!("this stderr panics (on purpose)");
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_log_thread_that_dies_leaves_logging_working() {
        let (mut writer, _guard) = spawn(Panics);
        // Queued, then handed to the thread, whose write panics.
        writer.shared.lock().writing = true;
        writer
            .write_all(b"the line that ends the thread\n")
            .unwrap();
        drop(Writing(&writer.shared));
        wait_until(&writer, "the thread's end was not marked", |p| p.done);
        // Nothing waits for a thread that is gone: this goes to stderr.
        writer
            .write_all(b"a line after the thread ended\n")
            .unwrap();
        assert!(writer.shared.lock().bytes.is_empty());
    }

    #[test]
    fn a_stalled_stderr_holds_loggers_back_at_the_bound_and_loses_nothing() {
        let sink = Sink::shut();
        let (writer, guard) = spawn(sink.clone());
        // Dropped before the guard, also when an assertion fails: the
        // guard's join would otherwise wait at the shut gate for ever.
        let _reopen = Reopen(sink.clone());
        let mut first = writer.clone();
        let holder = hold_a_write(&writer, move || first.write_all(b"first\n").unwrap());
        let line = format!("{}\n", "y".repeat(1023));
        let lines = 3 * MAX_PENDING / line.len();
        let logged = Arc::new(AtomicUsize::new(0));
        let logger = {
            let (mut writer, logged, line) = (writer.clone(), Arc::clone(&logged), line.clone());
            std::thread::spawn(move || {
                for _ in 0..lines {
                    writer.write_all(line.as_bytes()).unwrap();
                    logged.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        // One write is held at the shut gate and at most MAX_PENDING bytes
        // more wait; then the logger must wait too.
        let bound = MAX_PENDING / line.len() + 1;
        let mut last = usize::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = logged.load(Ordering::SeqCst);
            if now == last {
                break;
            }
            last = now;
        }
        assert!(
            !logger.is_finished(),
            "the logger ran past a stalled stderr"
        );
        assert!(
            last <= bound,
            "{last} lines taken while stderr was stalled (bound {bound})"
        );
        sink.open();
        holder.join().unwrap();
        logger.join().unwrap();
        drop(guard);
        assert_eq!(
            sink.text().len(),
            "first\n".len() + lines * line.len(),
            "every line, once"
        );
    }
}
