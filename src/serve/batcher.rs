//! Exact dynamic batching: concurrent requests gathered into one scheduled run.
//!
//! Each request brings `n` samples of one shape (its tensors' first axis), and requests
//! differ in width and in `n`. The batcher takes the first request waiting, then every
//! request already queued, and while another gathering runs, every request that arrives
//! within `max_delay` of the first, up to `max_gather` samples, and runs them all through
//! the runnable's scheduler ([`RaggedRunnable::run_each`]):
//! sorted by width, cut into ragged batches within the memory budget, run in lanes. Each
//! sample's outputs are what it gets alone (the ragged contract), so a request's answer
//! never depends on the requests it was gathered with. Requests whose shared inputs
//! differ run in separate runs of the same gathering.
//!
//! The queue is bounded (`max_queue` requests): a request that finds it full is refused
//! at once ([`Submit::Busy`], HTTP 429), never queued without limit. A request whose
//! deadline passes while it waits is answered [`Failure::Timeout`] without running. On
//! shutdown the batcher stops taking requests, runs those already queued, and exits.
//!
//! Several threads (`gatherers`, the backend's count by default) take turns: while one runs a gathering
//! (its batches in the runnable's lanes), another gathers the next behind it, for
//! `max_delay` from its first request.
//! A request that finds nothing running runs at once rather than waiting for company: the
//! wait only pays under load. So a lone request costs its run, and under load the
//! gathering, cut and replies of one gathering overlap the other's run. (Runs of the
//! runnable's lanes do not overlap each other: the lanes take one call at a time.)
//!
//! Past `max_delay`, a gathering keeps growing while `busy` gatherings run (the lanes have
//! work enough: on a device whose runs take turns, two, one running and one ready; on the
//! host, one per lane, which two gatherers never reach), and goes as soon as fewer do, as
//! a dynamic batcher forms its batch when the model is free: the requests would wait for
//! the lanes anyway, and the batches a device runs grow with the load instead of staying
//! as small as what arrives within `max_delay` (on a GPU a batch of 12 lines took about as
//! long as one of 32: benches/NOTES.md).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{
    Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel,
};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tract_core::internal::*;

use super::metrics::Metrics;
use crate::error::{self, ErrorKind};
use crate::schedule::{OnCut, Schedule};
use crate::{RaggedRunnable, Sample, Samples};

/// Why a request got no outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The request does not fit the model (a sample's shape, type or width): the
    /// client's fault.
    BadRequest(String),
    /// The request waited past its deadline.
    Timeout,
    /// The server is shutting down.
    Unavailable,
    /// The run failed otherwise (out of memory alone, the runtime): the server's fault.
    Internal(String),
}

impl Failure {
    /// The failure of an error the runnable gave, by its kind.
    pub fn of(e: &TractError) -> Failure {
        match error::kind(e) {
            ErrorKind::BadSample | ErrorKind::Refused => Failure::BadRequest(format!("{e:#}")),
            _ => Failure::Internal(format!("{e:#}")),
        }
    }

    /// One line for the client.
    pub fn message(&self) -> String {
        match self {
            Failure::BadRequest(m) | Failure::Internal(m) => m.clone(),
            Failure::Timeout => "the request's deadline passed before it ran".into(),
            Failure::Unavailable => "the server is shutting down".into(),
        }
    }
}

/// A request's outputs (in the model's order, each with the request's samples stacked on
/// a first axis), or why it has none.
pub type Reply = Result<TVec<Tensor>, Failure>;

/// A request, as the batcher runs it.
pub struct Job {
    /// Its per-sample inputs by name, each of `n` samples stacked on the first axis.
    pub inputs: Vec<(String, Tensor)>,
    /// The inputs it shares between its samples, by name.
    pub shared: Vec<(String, Tensor)>,
    /// Its count of samples.
    pub n: usize,
    /// When it must have run by, if ever.
    pub deadline: Option<Instant>,
    /// When it was made, just before it is queued: its wait is counted from there.
    pub queued: Instant,
    /// Where its reply goes.
    pub reply: tokio::sync::oneshot::Sender<Reply>,
}

/// What [`Batcher::submit`] did with a job.
pub enum Submit {
    /// Queued: its reply will come.
    Queued,
    /// The queue is full: try later.
    Busy,
    /// The batcher is shutting down.
    Closed,
}

/// How the batcher gathers (module doc).
#[derive(Clone, Debug)]
pub struct Gathering {
    /// How long a request may wait for others to join it.
    pub max_delay: Duration,
    /// The most samples one run takes.
    pub max_gather: usize,
    /// The most requests waiting.
    pub max_queue: usize,
    /// The threads that gather and run, each a gathering at a time (module doc): at
    /// least one.
    pub gatherers: usize,
    /// Gatherings running at which the lanes are busy: a gathering then grows past
    /// `max_delay` until fewer run (module doc). At least one.
    pub busy: usize,
}

/// The gathering threads and their queue (module doc).
pub struct Batcher {
    queue: SyncSender<Job>,
    closing: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What the gathering threads share: the queue's receiving end (held by the one gathering)
/// and how many gatherings are running.
struct Shared {
    jobs: Mutex<Receiver<Job>>,
    running: AtomicUsize,
}

impl Batcher {
    /// Starts the gathering threads over `runnable`.
    pub fn start(
        runnable: Arc<RaggedRunnable>,
        gathering: Gathering,
        metrics: Arc<Metrics>,
    ) -> TractResult<Batcher> {
        let (queue, jobs) = sync_channel(gathering.max_queue.max(1));
        let closing = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            jobs: Mutex::new(jobs),
            running: AtomicUsize::new(0),
        });
        let batcher = Batcher {
            queue,
            closing: closing.clone(),
            metrics: metrics.clone(),
            threads: Mutex::new(vec![]),
        };
        for ix in 0..gathering.gatherers.max(1) {
            let thread = std::thread::Builder::new()
                .name(format!("tract-ragged-batcher-{ix}"))
                .spawn({
                    let (runnable, gathering) = (runnable.clone(), gathering.clone());
                    let (shared, closing, metrics) =
                        (shared.clone(), closing.clone(), metrics.clone());
                    move || gather_and_run(&runnable, &gathering, &shared, &closing, &metrics)
                })
                .context("Starting the batcher's threads")?;
            if let Ok(mut threads) = batcher.threads.lock() {
                threads.push(thread);
            }
        }
        Ok(batcher)
    }

    /// Queues `job` unless the queue is full or the batcher is closing.
    pub fn submit(&self, job: Job) -> Submit {
        if self.closing.load(Ordering::SeqCst) {
            return Submit::Closed;
        }
        self.metrics.queue_depth.inc();
        match self.queue.try_send(job) {
            Ok(()) => Submit::Queued,
            Err(TrySendError::Full(_)) => {
                self.metrics.queue_depth.dec();
                Submit::Busy
            }
            Err(TrySendError::Disconnected(_)) => {
                self.metrics.queue_depth.dec();
                Submit::Closed
            }
        }
    }

    /// Stops taking requests, runs those queued, and waits for the threads to end.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let threads = self
            .threads
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.close();
    }
}

/// A thread's loop: gather, run, reply; until closing with nothing queued.
fn gather_and_run(
    runnable: &RaggedRunnable,
    gathering: &Gathering,
    shared: &Shared,
    closing: &AtomicBool,
    metrics: &Arc<Metrics>,
) {
    loop {
        let gathered = {
            let Ok(jobs) = shared.jobs.lock() else { return };
            match gather(&jobs, gathering, &shared.running, closing) {
                Some(gathered) => gathered,
                None => return,
            }
        };
        metrics.queue_depth.sub(gathered.len() as i64);
        shared.running.fetch_add(1, Ordering::SeqCst);
        run(runnable, gathered, metrics);
        shared.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The next gathering (module doc): the first request waiting, then those already queued,
/// and while another gathering runs, those arriving within `max_delay` of the first and
/// after it while the lanes are busy, up to `max_gather` samples. None once closing with
/// nothing queued, or the queue gone.
fn gather(
    jobs: &Receiver<Job>,
    gathering: &Gathering,
    running: &AtomicUsize,
    closing: &AtomicBool,
) -> Option<Vec<Job>> {
    let poll = Duration::from_millis(20);
    let first = loop {
        match jobs.recv_timeout(poll) {
            Ok(job) => break job,
            Err(RecvTimeoutError::Timeout) if closing.load(Ordering::SeqCst) => return None,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    };
    // Behind a run (the server under load), the gathering waits out `max_delay` for
    // company even once that run is over: a gathering cut short by every short run would
    // stay as small as the last, each paying a run's fixed costs for a few samples.
    let behind_a_run = running.load(Ordering::SeqCst) > 0;
    let until = Instant::now() + gathering.max_delay;
    let mut count = first.n;
    let mut gathered = vec![first];
    while count < gathering.max_gather {
        let job = match jobs.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => break,
            // Nothing queued, and nothing ran as the request came: run now.
            Err(TryRecvError::Empty) if !behind_a_run => break,
            Err(TryRecvError::Empty) => {
                let now = Instant::now();
                let wait = if now < until {
                    until - now
                } else if running.load(Ordering::SeqCst) >= gathering.busy.max(1)
                    && !closing.load(Ordering::SeqCst)
                {
                    // The lanes are busy: the requests would wait for them anyway, and
                    // wait in this gathering instead, making its batches larger.
                    Duration::from_millis(1)
                } else {
                    break;
                };
                match jobs.recv_timeout(wait) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        };
        count += job.n;
        gathered.push(job);
    }
    Some(gathered)
}

/// Runs gathered jobs, those sharing the same shared inputs together, and replies to each.
fn run(runnable: &RaggedRunnable, jobs: Vec<Job>, metrics: &Arc<Metrics>) {
    let now = Instant::now();
    let (late, mut jobs): (Vec<Job>, Vec<Job>) = jobs
        .into_iter()
        .partition(|j| j.deadline.is_some_and(|d| d < now));
    for job in late {
        let _ = job.reply.send(Err(Failure::Timeout));
    }
    while !jobs.is_empty() {
        let shared = jobs[0].shared.clone();
        let (group, rest): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|j| j.shared == shared);
        jobs = rest;
        run_group(runnable, group, &shared, metrics);
    }
}

/// Runs jobs of the same shared inputs as one scheduled run.
fn run_group(
    runnable: &RaggedRunnable,
    mut jobs: Vec<Job>,
    shared: &[(String, Tensor)],
    metrics: &Arc<Metrics>,
) {
    let started = Instant::now();
    for job in &jobs {
        metrics.waited(started.saturating_duration_since(job.queued).as_secs_f64());
    }
    let answers = split_samples(&mut jobs).and_then(|samples| {
        // Gatherings bring new batch sizes and widths every time: a batch whose plan
        // the runnable does not hold pays for preparing it (module doc).
        let mut schedule = Schedule::for_runnable(runnable).counting_new_plans(runnable);
        let metrics = metrics.clone();
        schedule.on_cut = Some(OnCut(Arc::new(move |batches, widths| {
            for batch in batches {
                let cells = (batch.samples.len() * batch.extents.iter().product::<usize>()) as u64;
                let used: usize = batch
                    .samples
                    .iter()
                    .map(|i| widths[*i].iter().product::<usize>())
                    .sum();
                metrics.planned(
                    batch.samples.len(),
                    cells,
                    cells.saturating_sub(used as u64),
                );
            }
        })));
        let mut samples = Samples::new(samples);
        for (name, tensor) in shared {
            samples = samples.shared(name.clone(), tensor);
        }
        runnable.run_each_scheduled(samples, &schedule)
    });
    metrics.ran(
        jobs.iter().map(|j| j.n).sum(),
        started.elapsed().as_secs_f64(),
    );
    let mut answers = match answers {
        Ok(answers) => answers.into_iter(),
        Err(e) => {
            let failure = Failure::of(&e);
            for job in jobs {
                let _ = job.reply.send(Err(failure.clone()));
            }
            return;
        }
    };
    for job in jobs {
        let own: Vec<_> = answers.by_ref().take(job.n).collect();
        let _ = job.reply.send(stack(own));
    }
}

/// Each job's samples, in order (its per-sample inputs cut along their first axis), taken
/// out of the jobs.
fn split_samples(jobs: &mut [Job]) -> TractResult<Vec<Sample<'static>>> {
    let mut samples = Vec::new();
    for job in jobs {
        if job.n == 1 {
            // One sample (a request a line): its inputs are the sample's, moved, no copy.
            let inputs = std::mem::take(&mut job.inputs)
                .into_iter()
                .map(|(name, mut t)| {
                    t.remove_axis(0)?;
                    Ok((name, t))
                })
                .collect::<TractResult<Vec<_>>>()?;
            samples.push(Sample::named(inputs));
            continue;
        }
        for i in 0..job.n {
            let inputs = job
                .inputs
                .iter()
                .map(|(name, t)| {
                    let mut one = t.slice(0, i, i + 1)?;
                    one.remove_axis(0)?;
                    Ok((name.clone(), one))
                })
                .collect::<TractResult<Vec<_>>>()?;
            samples.push(Sample::named(inputs));
        }
    }
    Ok(samples)
}

/// A request's reply from its samples' answers: the first failure, or each output with
/// the samples stacked on a new first axis.
fn stack(answers: Vec<crate::run::Answer>) -> Reply {
    let mut outputs: Vec<TVec<Tensor>> = Vec::with_capacity(answers.len());
    for (i, answer) in answers.into_iter().enumerate() {
        match answer {
            Ok(o) => outputs.push(o),
            Err(e) => {
                return Err(match Failure::of(&e) {
                    Failure::BadRequest(m) => Failure::BadRequest(format!("sample {i}: {m}")),
                    other => other,
                });
            }
        }
    }
    let Some(first) = outputs.first() else {
        return Ok(tvec!());
    };
    (0..first.len())
        .map(|k| {
            let parts = outputs
                .iter_mut()
                .map(|o| {
                    let mut t = std::mem::take(&mut o[k]);
                    t.insert_axis(0)?;
                    Ok(t)
                })
                .collect::<TractResult<Vec<Tensor>>>()?;
            Tensor::stack_tensors(0, &parts)
        })
        .collect::<TractResult<TVec<Tensor>>>()
        .map_err(|e| Failure::Internal(format!("Stacking a request's outputs: {e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathering(max_delay: Duration) -> Gathering {
        Gathering {
            max_delay,
            max_gather: 64,
            max_queue: 16,
            gatherers: 2,
            busy: 1,
        }
    }

    fn job() -> Job {
        Job {
            inputs: vec![],
            shared: vec![],
            n: 1,
            deadline: None,
            queued: Instant::now(),
            reply: tokio::sync::oneshot::channel().0,
        }
    }

    /// With nothing running, a gathering takes what is queued and goes at once; behind a
    /// run, it waits `max_delay` for requests to join, even once the run is over.
    #[test]
    fn a_gathering_waits_for_company_only_behind_a_run() {
        let (queue, jobs) = sync_channel(16);
        let (running, closing) = (Arc::new(AtomicUsize::new(0)), AtomicBool::new(false));
        let slow = gathering(Duration::from_secs(5));
        for _ in 0..3 {
            queue.send(job()).unwrap();
        }
        let started = Instant::now();
        let gathered = gather(&jobs, &slow, &running, &closing).unwrap();
        assert_eq!(gathered.len(), 3);
        assert!(started.elapsed() < Duration::from_secs(1));

        running.store(1, Ordering::SeqCst);
        queue.send(job()).unwrap();
        let late = std::thread::spawn({
            let queue = queue.clone();
            move || {
                std::thread::sleep(Duration::from_millis(50));
                queue.send(job()).unwrap();
            }
        });
        let over = std::thread::spawn({
            let running = running.clone();
            move || {
                std::thread::sleep(Duration::from_millis(10));
                running.store(0, Ordering::SeqCst);
            }
        });
        let gathered = gather(
            &jobs,
            &gathering(Duration::from_millis(400)),
            &running,
            &closing,
        );
        late.join().unwrap();
        over.join().unwrap();
        assert_eq!(
            gathered.unwrap().len(),
            2,
            "the late request joins behind the run"
        );
    }

    /// Past `max_delay`, a gathering behind `busy` runs keeps taking the requests that
    /// come until fewer run, then goes.
    #[test]
    fn a_gathering_grows_while_the_lanes_are_busy() {
        let (queue, jobs) = sync_channel(16);
        let (running, closing) = (Arc::new(AtomicUsize::new(1)), AtomicBool::new(false));
        queue.send(job()).unwrap();
        let feeder = std::thread::spawn({
            let (queue, running) = (queue.clone(), running.clone());
            move || {
                // Well past max_delay, while the run goes on.
                for _ in 0..3 {
                    std::thread::sleep(Duration::from_millis(30));
                    queue.send(job()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(30));
                running.store(0, Ordering::SeqCst);
                // After the run: not in this gathering.
                std::thread::sleep(Duration::from_millis(100));
                queue.send(job()).unwrap();
            }
        });
        let gathered = gather(
            &jobs,
            &gathering(Duration::from_millis(5)),
            &running,
            &closing,
        );
        feeder.join().unwrap();
        // Three that came while busy, and not the one after the run: it went at once.
        assert_eq!(gathered.unwrap().len(), 4);
    }
}
