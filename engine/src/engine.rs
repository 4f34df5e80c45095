//! The engine thread and its handle: requests in, events out, one forward call per step.

use std::collections::HashMap;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::Registry;
use sluice_models::host_logits::Row;
use sluice_models::{Adjust, HostLogits, KvStore, Logits, Model, ModelError, SeqChunk, StepBatch};
use tokio::sync::{mpsc as tmpsc, watch};

use crate::block_manager::BlockManager;
use crate::config::{EngineConfig, Resolved};
use crate::constraint::{ChoiceMatcher, Constraint, Grammar, GrammarError, Mask, Vocabulary};
use crate::error::{EngineError, SubmitError};
use crate::event::{Event, Finish, FinishReason, MatchedStop, Stage, Usage};
use crate::metrics::EngineMetrics;
use crate::request::{Limits, Request};
use crate::sampler::{made, sample_all, sample_top, Draw, Sampled};
use crate::scheduler::{Budget, Plan, Scheduler};
use crate::sequence::{Ended, RequestInfo, Seq};

/// Starts engines.
#[derive(Debug)]
pub struct Engine;

impl Engine {
    /// Allocates the KV pool and starts the step loop on its own OS thread. Metrics are
    /// registered in a new registry ([`EngineHandle::registry`]).
    pub fn start(model: Arc<Model>, config: EngineConfig) -> Result<EngineHandle, EngineError> {
        Self::start_with_registry(model, config, Registry::new())
    }

    /// As [`Engine::start`], registering the metrics in `registry` (shared with the gateway's).
    pub fn start_with_registry(
        model: Arc<Model>,
        config: EngineConfig,
        registry: Registry,
    ) -> Result<EngineHandle, EngineError> {
        let resolved = config.resolve(&model)?;
        let kv = model
            .new_kv_store(resolved.num_blocks, config.block_size)
            .map_err(|e| kv_error(e, &resolved, &config, &model))?;
        tracing::info!(
            num_blocks = resolved.num_blocks,
            block_size = config.block_size,
            backend = %model.backend(),
            device = %model.device(),
            "KV pool allocated"
        );
        let metrics =
            EngineMetrics::register(&registry, &config.model_name).map_err(EngineError::Metrics)?;
        crate::metrics::register_cache_config_info(
            &registry,
            &config.model_name,
            resolved.num_blocks,
            config.block_size,
        )
        .map_err(EngineError::Metrics)?;
        let (tx, rx) = mpsc::channel();
        let (stopped_tx, stopped_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            tx,
            load: LoadCounters::default(),
            shutting_down: AtomicBool::new(false),
            limits: Limits {
                vocab_size: sampled_vocab(&model),
                max_model_len: resolved.max_model_len,
                // A request's choices are admitted together, so n cannot exceed the batch.
                max_n: config.max_n.min(config.max_num_seqs),
            },
            max_waiting: config.max_waiting,
            num_blocks: resolved.num_blocks,
            metrics: metrics.clone(),
            registry,
            model: model.clone(),
            config: config.clone(),
            stopped: stopped_rx,
            vocabulary: OnceLock::new(),
            masks: MaskStats::default(),
        });
        shared
            .load
            .blocks_total
            .store(resolved.num_blocks, Ordering::Relaxed);
        let load = shared.clone();
        std::thread::Builder::new()
            .name(format!("sluice-engine-{}", config.model_name))
            .spawn(move || {
                let mut core = Core::new(model, &config, resolved, kv, metrics, load);
                core.run(rx);
                let _ = stopped_tx.send(true);
            })
            .map_err(EngineError::Thread)?;
        Ok(EngineHandle { shared })
    }
}

/// A KV pool the device could not hold: the figure and the flags that set it.
fn kv_error(e: ModelError, r: &Resolved, config: &EngineConfig, model: &Model) -> EngineError {
    let mib = (r.num_blocks * KvStore::bytes_per_block(model.config(), config.block_size)) >> 20;
    EngineError::Config(format!(
        "the KV pool of {} blocks ({mib} MiB) does not fit on {}: {e}; lower \
         --gpu-memory-utilization (GPU) or --kv-cache-mib (CPU)",
        r.num_blocks,
        model.device()
    ))
}

/// A cheap, cloneable way to talk to a running engine.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    tx: mpsc::Sender<Command>,
    load: LoadCounters,
    shutting_down: AtomicBool,
    limits: Limits,
    max_waiting: usize,
    num_blocks: usize,
    metrics: EngineMetrics,
    registry: Registry,
    model: Arc<Model>,
    config: EngineConfig,
    stopped: watch::Receiver<bool>,
    /// The vocabulary grammars compile against, built at the first constrained request.
    vocabulary: OnceLock<Result<Arc<Vocabulary>, GrammarError>>,
    masks: MaskStats,
}

/// What grammar masks have cost, summed since the engine started.
#[derive(Debug, Default)]
struct MaskStats {
    count: AtomicU64,
    /// Time spent computing masks (beside the forward pass or after it).
    compute_ns: AtomicU64,
    /// Time the step waited for masks after its forward pass had finished.
    wait_ns: AtomicU64,
}

/// Grammar masks' cost since the engine started ([`EngineHandle::mask_cost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaskCost {
    /// Masks computed (one per constrained token sampled).
    pub masks: u64,
    /// Total time computing them.
    pub compute: std::time::Duration,
    /// Total time steps waited for them once the forward pass was done: their cost on the
    /// critical path.
    pub wait: std::time::Duration,
}

#[derive(Debug, Default)]
struct LoadCounters {
    /// Submitted but not yet seen by the engine thread.
    in_flight: AtomicUsize,
    queued: AtomicUsize,
    running: AtomicUsize,
    blocks_used: AtomicUsize,
    blocks_total: AtomicUsize,
    prefill_backlog: AtomicUsize,
}

/// What a router needs to know about an engine's load, as of the last step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Sequences waiting for admission (including requests not yet picked up).
    pub waiting: usize,
    pub running: usize,
    /// KV blocks held by sequences (cached but unused blocks do not count).
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Prompt tokens still to prefill, waiting and running.
    pub prefill_tokens_waiting: usize,
}

enum Command {
    Submit(Box<Submission>),
    Shutdown,
}

struct Submission {
    request: Request,
    max_tokens: usize,
    events: tmpsc::UnboundedSender<Event>,
    arrival: Instant,
}

impl EngineHandle {
    /// Queues a request. It is checked here, so a request that cannot run fails at once; an
    /// accepted one always ends with a `Finish` event per choice. Dropping the stream aborts
    /// the request within one step.
    pub fn submit(&self, request: Request) -> Result<EventStream, SubmitError> {
        let s = &self.shared;
        if s.shutting_down.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        let max_tokens = request.validate(&s.limits)?;
        let waiting =
            s.load.in_flight.fetch_add(1, Ordering::AcqRel) + s.load.queued.load(Ordering::Acquire);
        if waiting >= s.max_waiting {
            s.load.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull {
                max_waiting: s.max_waiting,
            });
        }
        let (events, rx) = tmpsc::unbounded_channel();
        let sub = Submission {
            request,
            max_tokens,
            events,
            arrival: Instant::now(),
        };
        if s.tx.send(Command::Submit(Box::new(sub))).is_err() {
            s.load.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(EventStream { rx })
    }

    /// Compiles a grammar against this engine's vocabulary, for
    /// [`SamplingParams::constraint`](crate::SamplingParams::constraint). CPU work bounded
    /// by the grammar limits (see `constraint`); run it off async workers. The first call
    /// also builds the vocabulary's trie (tens of milliseconds).
    pub fn compile(&self, grammar: &Grammar) -> Result<Arc<Constraint>, GrammarError> {
        let s = &self.shared;
        let vocabulary = s.vocabulary.get_or_init(|| {
            let eos: Vec<u32> = s.model.tokenizer().eos_ids().iter().copied().collect();
            Vocabulary::new(s.model.clone(), &eos).map(Arc::new)
        });
        let vocabulary = vocabulary.as_ref().map_err(Clone::clone)?;
        vocabulary.compile(grammar).map(Arc::new)
    }

    /// What grammar masks have cost so far.
    pub fn mask_cost(&self) -> MaskCost {
        let m = &self.shared.masks;
        let ns = |a: &AtomicU64| std::time::Duration::from_nanos(a.load(Ordering::Relaxed));
        MaskCost {
            masks: m.count.load(Ordering::Relaxed),
            compute: ns(&m.compute_ns),
            wait: ns(&m.wait_ns),
        }
    }

    /// Queue, running and KV figures as of the last step.
    pub fn load(&self) -> Load {
        let l = &self.shared.load;
        Load {
            waiting: l.in_flight.load(Ordering::Acquire) + l.queued.load(Ordering::Acquire),
            running: l.running.load(Ordering::Acquire),
            kv_blocks_used: l.blocks_used.load(Ordering::Acquire),
            kv_blocks_total: l.blocks_total.load(Ordering::Acquire),
            prefill_tokens_waiting: l.prefill_backlog.load(Ordering::Acquire),
        }
    }

    /// The registry holding this engine's metrics.
    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.shared.metrics
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.shared.model
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Longest prompt + completion accepted.
    pub fn max_model_len(&self) -> usize {
        self.shared.limits.max_model_len
    }

    pub fn num_kv_blocks(&self) -> usize {
        self.shared.num_blocks
    }

    /// Stops accepting requests; the engine finishes those it has, then its thread exits.
    pub fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        let _ = self.shared.tx.send(Command::Shutdown);
    }

    pub fn is_stopped(&self) -> bool {
        *self.shared.stopped.borrow()
    }

    /// Waits until the engine thread has exited (after [`EngineHandle::shutdown`]).
    pub async fn stopped(&self) {
        let mut rx = self.shared.stopped.clone();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// A request's events: deltas and one `Finish` per choice, then the end.
#[derive(Debug)]
pub struct EventStream {
    rx: tmpsc::UnboundedReceiver<Event>,
}

impl EventStream {
    pub async fn next_event(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// An event already sent, without waiting.
    pub fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// For callers outside an async runtime (benchmarks, tests on plain threads).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

impl futures_core::Stream for EventStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

/// What the forward pass returns, a panic caught.
type ForwardResult = std::thread::Result<sluice_models::Result<HostLogits>>;
/// A step's mask for one sequence, or why its grammar failed.
type MaskResult = Result<Mask, String>;
/// A sequence's running index, its matcher and its mask.
type Computed = (usize, ChoiceMatcher, MaskResult);

/// What a sequence's draw needs besides its logits row.
struct Prepared {
    suppress: Vec<u32>,
    mask: Option<Mask>,
}

/// The rows of logits each sequence of `batch` gets back, in the order they come.
fn row_ranges(batch: &StepBatch) -> Vec<Range<usize>> {
    let mut at = 0;
    batch
        .seqs
        .iter()
        .map(|s| {
            let rows = at..at + s.logit_rows();
            at = rows.end;
            rows
        })
        .collect()
}

/// Computes the masks of `work`, timing them.
fn compute_masks(work: Vec<(usize, ChoiceMatcher)>, stats: &MaskStats) -> Vec<Computed> {
    let started = Instant::now();
    let n = work.len() as u64;
    let out = work
        .into_iter()
        .map(|(i, mut m)| {
            let mask = m.mask();
            (i, m, mask)
        })
        .collect();
    stats.count.fetch_add(n, Ordering::Relaxed);
    stats
        .compute_ns
        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    out
}

/// The end of a choice whose grammar failed (a step over its limits, say).
fn grammar_failed(e: &str) -> Ended {
    Ended {
        reason: FinishReason::Grammar(e.to_string()),
        matched: None,
    }
}

/// The ids a step may sample: the logits' width, cut to the tokenizer's vocabulary where the
/// model's is larger. Padded embedding tables are common (and synthetic models borrow a
/// smaller tokenizer); an id with no text could never be sent, so it is never drawn, and
/// `logit_bias` may not name it.
fn sampled_vocab(model: &Model) -> usize {
    let (logits, text) = (model.config().vocab_size, model.tokenizer().vocab_size());
    if text < logits {
        tracing::warn!(
            logits,
            tokenizer = text,
            "the model scores more ids than its tokenizer has; ids past the tokenizer's are \
             never sampled"
        );
    }
    logits.min(text)
}

/// The state the engine thread owns.
struct Core {
    model: Arc<Model>,
    kv: KvStore,
    sched: Scheduler,
    metrics: EngineMetrics,
    shared: Arc<Shared>,
    budget: Budget,
    caching: bool,
    next_arrival: u64,
    draining: bool,
    /// Whether grammar masks are computed on a thread beside the forward pass (a core is
    /// free while it runs) or on the engine thread after it (see [`masks_beside`]).
    masks_beside: bool,
    /// The threads a step's rows are sampled on ([`draw_threads`]): idle while the forward
    /// pass runs, which is done by the time they sample.
    draw_pool: rayon::ThreadPool,
}

/// Threads to sample a step's rows on: the forward pass's on the CPU (so `--threads` bounds
/// what the replica uses), every core on a GPU (the CPU has nothing else to do then).
fn draw_threads(model: &Model) -> usize {
    match model.network().threads() {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Whether a core is free while the forward pass runs, so masks computed beside it cost the
/// step nothing: on a GPU (the CPU waits for the device), or when the CPU forward uses fewer
/// threads than there are cores. When its threads fill every core, a mask thread would take
/// a core from one of them in the middle of a parallel kernel, and every other thread would
/// wait at the kernel's end for the one descheduled: computing the masks after the forward,
/// on the engine thread, costs the step only their own time.
fn masks_beside(model: &Model) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    model.network().threads() < cores
}

impl Core {
    fn new(
        model: Arc<Model>,
        config: &EngineConfig,
        resolved: Resolved,
        kv: KvStore,
        metrics: EngineMetrics,
        shared: Arc<Shared>,
    ) -> Self {
        let budget = Budget {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            block_size: config.block_size,
            watermark_blocks: resolved.watermark_blocks,
        };
        let blocks = BlockManager::new(resolved.num_blocks, config.enable_prefix_caching);
        let masks_beside = masks_beside(&model);
        let draw_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(draw_threads(&model))
            .thread_name(|i| format!("sluice-sample-{i}"))
            .build()
            .expect("a thread pool for sampling");
        Self {
            model,
            kv,
            sched: Scheduler::new(budget, blocks),
            metrics,
            shared,
            budget,
            caching: config.enable_prefix_caching,
            next_arrival: 0,
            draining: false,
            masks_beside,
            draw_pool,
        }
    }

    fn run(&mut self, rx: mpsc::Receiver<Command>) {
        loop {
            if self.sched.is_idle() {
                if self.draining {
                    break;
                }
                match rx.recv() {
                    Ok(cmd) => self.command(cmd),
                    // Every handle is gone and nothing is left to do.
                    Err(_) => break,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                self.command(cmd);
            }
            self.step();
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(sub) => {
                self.shared.load.in_flight.fetch_sub(1, Ordering::AcqRel);
                self.accept(*sub);
            }
            Command::Shutdown => self.draining = true,
        }
        self.publish_load();
    }

    fn accept(&mut self, sub: Submission) {
        let tok = self.model.tokenizer();
        let p = &sub.request.sampling;
        let all_eos: Vec<u32> = tok.eos_ids().iter().copied().collect();
        let (eos, grammar_eos) = match (p.ignore_eos, &p.constraint) {
            (false, _) => (all_eos, Vec::new()),
            (true, None) => (Vec::new(), Vec::new()),
            (true, Some(_)) => (Vec::new(), all_eos),
        };
        self.next_arrival += 1;
        let resume = sub.request.resume;
        let info = Arc::new(RequestInfo {
            params: sub.request.sampling,
            max_tokens: sub.max_tokens,
            priority: sub.request.priority,
            prompt_len: sub.request.prompt.len(),
            arrival: sub.arrival,
            arrival_seq: self.next_arrival,
            events: sub.events,
            eos,
            grammar_eos,
            deadline: sub.request.deadline,
            choice_base: resume.as_ref().map_or(0, |r| r.choice),
        });
        let mut seq = Seq::new(info, 0, sub.request.prompt);
        if let Some(r) = resume {
            if let Some(end) = seq.replay(self.model.tokenizer(), &r.output) {
                // The output already ended the choice (its finish was lost on the way).
                self.finish(seq, end.reason, end.matched);
                return;
            }
        }
        self.sched.enqueue(seq);
    }

    /// One iteration: drop aborted requests, plan, run the forward pass, sample, stream.
    fn step(&mut self) {
        let started = Instant::now();
        self.reap_aborted();
        self.reap_expired(started);
        if self.sched.is_idle() {
            self.publish_load();
            return;
        }
        let plan = self.sched.plan();
        self.count_plan(&plan);
        let scheduled: Vec<usize> = (0..plan.tokens.len())
            .filter(|&i| plan.tokens[i] > 0)
            .collect();
        if scheduled.is_empty() {
            // Cannot happen by construction (with nothing running, the first waiting sequence
            // always fits: the pool holds one longest sequence and n ≤ max_num_seqs). Should it
            // ever, wait a little instead of spinning.
            tracing::warn!(
                "a step with work queued scheduled nothing: {:?}",
                self.shared.load
            );
            self.publish_load();
            std::thread::sleep(std::time::Duration::from_millis(1));
            return;
        }
        let mut batch = StepBatch::new();
        // What each sequence's pick changes in its row first (bias, penalties).
        let mut adjust: Vec<Option<Adjust>> = Vec::with_capacity(scheduled.len());
        let width = self.shared.limits.vocab_size as u32;
        let picks_on_device = self.model.picks_on_device();
        for &i in &scheduled {
            let s = &mut self.sched.running[i];
            let n = plan.tokens[i];
            let start = s.num_computed;
            s.timing.first_scheduled.get_or_insert(started);
            let ends = start + n == s.tokens.len();
            // Rows the prompt's log-probabilities need: every row of the chunk.
            let gathers = s.prompt_rows_from().is_some_and(|p| p < start + n);
            let pick = (ends && !gathers)
                .then(|| s.device_pick(width, picks_on_device))
                .flatten();
            let (logits, changes) = match pick {
                Some((pick, changes)) => (Logits::Pick(pick), changes),
                None if gathers => (Logits::All, None),
                None if !ends => (Logits::None, None),
                None => (Logits::Last, None),
            };
            adjust.push(changes);
            batch.push(SeqChunk {
                tokens: s.tokens[start..start + n].to_vec(),
                start_pos: start,
                block_table: s.blocks.clone(),
                logits,
            });
        }
        self.metrics.batch_tokens.observe(batch.num_tokens() as f64);
        self.metrics
            .batch_sequences
            .observe(batch.seqs.len() as f64);
        let work = self.take_matchers(&scheduled, &plan);
        let constrained: Vec<usize> = work.iter().map(|(i, _)| *i).collect();
        let (result, computed) = self.forward_with_masks((&batch, &adjust), work);
        let masks = self.return_matchers(&constrained, computed);
        let logits: HostLogits = match result {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                let e: sluice_models::ModelError = e;
                self.fail_running(&format!("the forward pass failed: {e}"), false);
                return;
            }
            Err(_) => {
                self.fail_running("the forward pass panicked", true);
                return;
            }
        };
        self.after_forward((&scheduled, &plan, &batch), &logits, masks);
        self.metrics
            .step_seconds
            .observe(started.elapsed().as_secs_f64());
        self.publish_load();
    }

    /// The matchers of constrained sequences that sample this step (their chunk reaches their
    /// last token), taken out so their masks can be computed beside the forward pass (or
    /// after it).
    fn take_matchers(&mut self, scheduled: &[usize], plan: &Plan) -> Vec<(usize, ChoiceMatcher)> {
        scheduled
            .iter()
            .filter_map(|&i| {
                let s = &mut self.sched.running[i];
                let samples = s.num_computed + plan.tokens[i] == s.tokens.len();
                samples.then(|| s.matcher.take().map(|m| (i, m))).flatten()
            })
            .collect()
    }

    /// Runs the forward pass and computes the masks of `work`: beside it on a second thread
    /// when a core is free for them ([`masks_beside`]), else after it on this thread. The
    /// time the step spends on masks once the forward is done is counted as waited for.
    fn forward_with_masks(
        &mut self,
        (batch, adjust): (&StepBatch, &[Option<Adjust>]),
        work: Vec<(usize, ChoiceMatcher)>,
    ) -> (ForwardResult, Vec<Computed>) {
        let model = self.model.clone();
        let kv = &mut self.kv;
        let mut forward = move || {
            catch_unwind(AssertUnwindSafe(|| {
                model.forward_host_adjusted(batch, kv, adjust)
            }))
        };
        if work.is_empty() {
            return (forward(), Vec::new());
        }
        let stats = &self.shared.masks;
        let (result, computed, waited) = if self.masks_beside {
            std::thread::scope(|scope| {
                let masks = scope.spawn(move || compute_masks(work, stats));
                let result = forward();
                let waited = Instant::now();
                // A panic in the grammar code fails those sequences (`return_matchers`).
                let computed = masks.join().unwrap_or_default();
                (result, computed, waited.elapsed())
            })
        } else {
            let result = forward();
            let waited = Instant::now();
            let computed = catch_unwind(AssertUnwindSafe(|| compute_masks(work, stats)));
            (result, computed.unwrap_or_default(), waited.elapsed())
        };
        stats
            .wait_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        (result, computed)
    }

    /// Puts the matchers back into their sequences; the masks by running index. A sequence
    /// of `constrained` whose matcher did not come back (the mask thread panicked) gets an
    /// error for a mask, which ends it.
    fn return_matchers(
        &mut self,
        constrained: &[usize],
        computed: Vec<Computed>,
    ) -> HashMap<usize, MaskResult> {
        let mut masks: HashMap<usize, MaskResult> = constrained
            .iter()
            .map(|&i| (i, Err("computing the mask panicked".to_string())))
            .collect();
        for (i, m, mask) in computed {
            self.sched.running[i].matcher = Some(m);
            masks.insert(i, mask);
        }
        masks
    }

    fn count_plan(&self, plan: &Plan) {
        self.metrics.preemptions.inc_by(plan.preempted as u64);
        self.metrics
            .prefix_queries
            .inc_by(plan.cache_queried as u64);
        self.metrics.prefix_hits.inc_by(plan.cache_hits as u64);
    }

    /// Advances every scheduled sequence (gathering the prompt log-probabilities its rows
    /// give), samples those whose chunk reached their end (their rows drawn in parallel),
    /// and retires the finished.
    fn after_forward(
        &mut self,
        (scheduled, plan, batch): (&[usize], &Plan, &StepBatch),
        logits: &HostLogits,
        mut masks: HashMap<usize, MaskResult>,
    ) {
        let now = Instant::now();
        let width = self.shared.limits.vocab_size;
        let row_of = |row: usize| &logits.row(row)[..width];
        let rows = row_ranges(batch);
        for (k, &i) in scheduled.iter().enumerate() {
            // Every row of a chunk that gathers; none otherwise (a prompt of one token has
            // none to gather, but still sends its empty list).
            let chunk = &batch.seqs[k];
            let given = match chunk.logits {
                Logits::All => chunk.tokens.len(),
                _ => 0,
            };
            let first = rows[k].start;
            let s = &mut self.sched.running[i];
            s.gather_prompt_logprobs((chunk.start_pos, given), |j| row_of(first + j));
        }
        let mut ended: Vec<(usize, Ended)> = Vec::new();
        let mut forked: Vec<Seq> = Vec::new();
        let mut draws: Vec<(usize, usize, Prepared)> = Vec::new();
        // Rows the model answered with their token: their draw is made.
        let mut picked: Vec<(usize, Result<Sampled, String>)> = Vec::new();
        for (i, row) in self.advance(scheduled, plan, &rows) {
            let s = &mut self.sched.running[i];
            match logits.get(row) {
                Row::Picked(token) => {
                    picked.push((i, Ok(made(&mut s.sampler, token))));
                    continue;
                }
                Row::Top(top) => {
                    picked.push((i, Ok(sample_top(top, &s.req.params, &mut s.sampler))));
                    continue;
                }
                Row::Logits(_) => {}
            }
            let mask = masks.remove(&i);
            if s.forks_left > 0 {
                forked.extend(self.fork(i, row_of(row), mask.as_ref()));
            }
            match Self::prepare(&mut self.sched.running[i], mask) {
                Ok(prepared) => draws.push((i, row, prepared)),
                Err(end) => ended.push((i, end)),
            }
        }
        let sampled = self.draw_rows(&draws, row_of);
        let drawn = draws.iter().map(|(i, _, _)| *i).zip(sampled);
        for (i, sampled) in picked.into_iter().chain(drawn) {
            let s = &mut self.sched.running[i];
            if let Some(end) = Self::take_token(&self.model, &self.metrics, s, sampled, now) {
                ended.push((i, end));
            }
        }
        // Finished sequences leave in descending index order so indices stay valid.
        ended.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (i, end) in ended {
            let seq = self.sched.finish_running(i);
            self.finish(seq, end.reason, end.matched);
        }
        for mut child in forked {
            child.timing.first_scheduled.get_or_insert(now);
            self.sched.add_running(child);
        }
    }

    /// Moves every scheduled sequence past the tokens the step computed (registering the
    /// blocks they filled in the prefix cache); returns those whose chunk reached their end,
    /// with the logits row each samples from (the last of its `rows`).
    fn advance(
        &mut self,
        scheduled: &[usize],
        plan: &Plan,
        rows: &[Range<usize>],
    ) -> Vec<(usize, usize)> {
        let bs = self.budget.block_size;
        let mut sampling = Vec::new();
        for (k, &i) in scheduled.iter().enumerate() {
            let s = &mut self.sched.running[i];
            s.num_computed += plan.tokens[i];
            if self.caching {
                while s.hashes.len() < s.num_computed / bs {
                    let b = s.hashes.len();
                    let h = crate::block_manager::block_hash(
                        s.hashes.last().copied(),
                        &s.tokens[b * bs..(b + 1) * bs],
                    );
                    self.sched.blocks.register(s.blocks[b], h);
                    s.hashes.push(h);
                }
            }
            if s.num_computed == s.tokens.len() {
                sampling.push((i, rows[k].end - 1));
            }
        }
        sampling
    }

    /// Samples the rows of `draws` (running index, logits row, what the draw needs) on the
    /// sampling pool, each with its own sequence's parameters and random stream.
    fn draw_rows<'a>(
        &mut self,
        draws: &'a [(usize, usize, Prepared)],
        row_of: impl Fn(usize) -> &'a [f32],
    ) -> Vec<Result<Sampled, String>> {
        let mut seqs: Vec<Option<&mut Seq>> = self.sched.running.iter_mut().map(Some).collect();
        let rows: Vec<Draw<'_>> = draws
            .iter()
            .map(|(i, row, prepared)| {
                let Seq { req, sampler, .. } = seqs[*i].take().expect("one draw per sequence");
                Draw {
                    raw: row_of(*row),
                    params: &req.params,
                    state: sampler,
                    suppress: &prepared.suppress,
                    mask: prepared.mask.as_ref(),
                }
            })
            .collect();
        sample_all(&self.draw_pool, rows)
    }

    /// What `s`'s draw needs besides its logits: its grammar's mask (the step's, or computed
    /// now for a constrained sequence the step computed none for) and the tokens it may not
    /// choose yet; or how it ended, if its grammar failed.
    fn prepare(s: &mut Seq, mask: Option<MaskResult>) -> Result<Prepared, Ended> {
        let mask = mask.or_else(|| s.matcher.as_mut().map(ChoiceMatcher::mask));
        let mask = match mask {
            Some(Err(e)) => return Err(grammar_failed(&e)),
            Some(Ok(m)) => Some(m),
            None => None,
        };
        Ok(Prepared {
            suppress: s.suppressed(),
            mask,
        })
    }

    /// Streams the token `s` sampled (through its grammar, if it has one); returns how the
    /// choice ended, if it did (an error if its draw failed).
    fn take_token(
        model: &Model,
        metrics: &EngineMetrics,
        s: &mut Seq,
        sampled: Result<Sampled, String>,
        now: Instant,
    ) -> Option<Ended> {
        let sampled = match sampled {
            Ok(sampled) => sampled,
            Err(e) => {
                tracing::error!("{e}; failing the choice");
                return Some(Ended {
                    reason: FinishReason::Error(e),
                    matched: None,
                });
            }
        };
        Self::record_token(metrics, s, now);
        let complete = match s.matcher.as_mut().map(|m| m.consume(sampled.token)) {
            Some(Err(e)) => return Some(grammar_failed(&e)),
            Some(Ok(complete)) => complete,
            None => false,
        };
        let end = s.append(model.tokenizer(), sampled.token, sampled.logprob);
        match end {
            None if complete => Some(s.grammar_done(model.tokenizer())),
            end => end,
        }
    }

    /// Samples one token for `s` from `raw` (within `mask`, its grammar's mask for this step)
    /// and streams it; returns how it ended, if it did. A forked choice's first token, drawn
    /// alone.
    fn emit_token(
        model: &Model,
        metrics: &EngineMetrics,
        s: &mut Seq,
        raw: &[f32],
        mask: Option<MaskResult>,
        now: Instant,
    ) -> Option<Ended> {
        let prepared = match Self::prepare(s, mask) {
            Ok(p) => p,
            Err(end) => return Some(end),
        };
        let req = s.req.clone();
        let sampled = Draw {
            raw,
            params: &req.params,
            state: &mut s.sampler,
            suppress: &prepared.suppress,
            mask: prepared.mask.as_ref(),
        }
        .sample();
        Self::take_token(model, metrics, s, sampled, now)
    }

    fn record_token(metrics: &EngineMetrics, s: &mut Seq, now: Instant) {
        metrics.generation_tokens.inc();
        match s.timing.last_token {
            None => {
                if s.index == 0 {
                    metrics.prompt_tokens.inc_by(s.req.prompt_len as u64);
                    metrics
                        .request_prompt_tokens
                        .observe(s.req.prompt_len as f64);
                }
                metrics
                    .ttft
                    .observe(now.duration_since(s.req.arrival).as_secs_f64());
                s.timing.first_token = Some(now);
            }
            Some(last) => metrics.itl.observe(now.duration_since(last).as_secs_f64()),
        }
        s.timing.last_token = Some(now);
    }

    /// Creates choices 1..n of running sequence `i`, whose prompt just finished: each shares
    /// the prompt's full blocks, draws its first token from the same logits, and recomputes
    /// only the prompt's partial last block.
    /// A constrained parent's `mask` (its grammar's start) is every child's first mask too.
    fn fork(&mut self, i: usize, raw: &[f32], mask: Option<&MaskResult>) -> Vec<Seq> {
        let bs = self.budget.block_size;
        let parent = &mut self.sched.running[i];
        let n = std::mem::take(&mut parent.forks_left);
        let prompt = parent.tokens.clone();
        let full = prompt.len() / bs;
        let shared_blocks = parent.blocks[..full].to_vec();
        let hashes = parent.hashes[..full.min(parent.hashes.len())].to_vec();
        let req = parent.req.clone();
        let (cached, first_scheduled) = (parent.cached_prompt, parent.timing.first_scheduled);
        let now = Instant::now();
        let mut out = Vec::new();
        for index in 1..=n {
            let mut child = Seq::new(req.clone(), index, prompt.clone());
            child.cached_prompt = cached;
            child.timing.first_scheduled = first_scheduled;
            for &b in &shared_blocks {
                self.sched.blocks.share(b);
            }
            child.blocks = shared_blocks.clone();
            // Without the prefix cache the shared blocks have no hashes: recompute them all.
            if hashes.len() == full {
                child.hashes = hashes.clone();
                child.num_computed = full * bs;
            } else {
                self.sched.blocks.release(&child.blocks);
                child.blocks.clear();
            }
            let first = mask.cloned();
            if let Some(end) =
                Self::emit_token(&self.model, &self.metrics, &mut child, raw, first, now)
            {
                self.sched.blocks.release(&child.blocks);
                child.blocks.clear();
                self.finish(child, end.reason, end.matched);
                continue;
            }
            out.push(child);
        }
        out
    }

    /// Sends the choice's finish and records its metrics. Its blocks are already released.
    fn finish(&self, seq: Seq, reason: FinishReason, matched: Option<MatchedStop>) {
        let now = Instant::now();
        let m = &self.metrics;
        let arrival = seq.req.arrival;
        m.e2e.observe(now.duration_since(arrival).as_secs_f64());
        if let Some(sched) = seq.timing.first_scheduled {
            m.queue_time
                .observe(sched.duration_since(arrival).as_secs_f64());
            if let Some(first) = seq.timing.first_token {
                m.prefill_time
                    .observe(first.duration_since(sched).as_secs_f64());
                m.decode_time
                    .observe(now.duration_since(first).as_secs_f64());
            }
        }
        m.finished(reason.label());
        m.request_generation_tokens.observe(seq.output_len() as f64);
        let usage = Usage {
            prompt_tokens: seq.req.prompt_len,
            completion_tokens: seq.output_len(),
            cached_prompt_tokens: seq.cached_prompt.unwrap_or(0),
        };
        let _ = seq.req.events.send(Event::Finish(Finish {
            index: seq.index,
            reason,
            usage,
            matched_stop: matched,
        }));
    }

    /// Aborts every sequence whose stream was dropped.
    fn reap_aborted(&mut self) {
        self.reap(|s| s.req.events.is_closed(), |_, _| FinishReason::Abort);
    }

    /// Stops every sequence whose deadline has passed, freeing its blocks: a running one in
    /// prefill (no token sampled yet) or decode, a waiting one in the queue.
    fn reap_expired(&mut self, now: Instant) {
        let expired = |s: &Seq| s.req.deadline.is_some_and(|d| now >= d);
        let stage = |seq: &Seq, running: bool| {
            // A preempted sequence had been scheduled: its stage is where it had got to.
            let scheduled = running || seq.timing.first_scheduled.is_some();
            let stage = match (scheduled, seq.timing.first_token) {
                (false, _) => Stage::Queue,
                (true, None) => Stage::Prefill,
                (true, Some(_)) => Stage::Decode,
            };
            FinishReason::Deadline(stage)
        };
        self.reap(expired, stage);
    }

    /// Finishes every sequence, running or waiting, that `doomed` picks, with the reason `why`
    /// gives it (told whether it was running), freeing its blocks.
    fn reap(&mut self, doomed: impl Fn(&Seq) -> bool, why: impl Fn(&Seq, bool) -> FinishReason) {
        let mut i = 0;
        while i < self.sched.running.len() {
            if doomed(&self.sched.running[i]) {
                let seq = self.sched.finish_running(i);
                let reason = why(&seq, true);
                self.finish(seq, reason, None);
            } else {
                i += 1;
            }
        }
        let gone: Vec<_> = self
            .sched
            .waiting
            .iter()
            .filter(|(_, s)| doomed(s))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            let seq = self.sched.waiting.remove(&k).expect("key just listed");
            let reason = why(&seq, false);
            self.finish(seq, reason, None);
        }
    }

    /// Ends every running sequence with an error. After a panic the block bookkeeping may be
    /// half-updated, so it starts over (the prefix cache is lost; waiting sequences hold no
    /// blocks and stay queued).
    fn fail_running(&mut self, message: &str, reset_blocks: bool) {
        tracing::error!(
            "{message}; failing {} running sequences",
            self.sched.running.len()
        );
        let running = std::mem::take(&mut self.sched.running);
        for seq in running {
            if !reset_blocks {
                self.sched.blocks.release(&seq.blocks);
            }
            self.finish(seq, FinishReason::Error(message.to_string()), None);
        }
        if reset_blocks {
            self.sched.blocks = BlockManager::new(self.sched.blocks.num_blocks(), self.caching);
        }
        self.publish_load();
    }

    fn publish_load(&self) {
        let l = &self.shared.load;
        let waiting = self.sched.waiting.len();
        let running = self.sched.running.len();
        let used = self.sched.blocks.num_in_use();
        l.queued.store(waiting, Ordering::Release);
        l.running.store(running, Ordering::Release);
        l.blocks_used.store(used, Ordering::Release);
        l.prefill_backlog
            .store(self.sched.prefill_backlog(), Ordering::Release);
        let m = &self.metrics;
        m.requests_waiting.set(waiting as i64);
        m.requests_running.set(running as i64);
        m.kv_cache_usage
            .set(used as f64 / self.sched.blocks.num_blocks() as f64);
    }
}
