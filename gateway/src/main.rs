//! `sluice`: the gateway binary. `sluice serve` runs the OpenAI-compatible server with an
//! in-process engine (`--model`, the default), routes to remote replicas (`--upstream`,
//! `--discover`), or both; `sluice inspect` describes a model file.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use sluice_engine::{Engine, EngineConfig};
use sluice_gateway::admission::{Admission, AdmissionConfig};
use sluice_gateway::api::{self, AppState, HttpLimits};
use sluice_gateway::backend::LocalBackend;
use sluice_gateway::config::{ServeArgs, ServeConfig};
use sluice_gateway::discovery;
use sluice_gateway::metrics::GatewayMetrics;
use sluice_gateway::rate_limit::RateLimiter;
use sluice_gateway::router::Router;
use sluice_gateway::server::{self, ServeOptions};
use sluice_gateway::tenants::Tenants;
use sluice_models::chat_template::ChatTemplate;
use sluice_models::{registry, Model, ModelOptions};

#[derive(Parser, Debug)]
#[command(name = "sluice", version, about = "LLM inference gateway and replica")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the OpenAI-compatible API: a model in this process, remote replicas, or both.
    Serve(Box<ServeArgs>),
    /// Load a model and print what it is: architecture, sizes, special tokens, load time.
    Inspect {
        /// A path to a .gguf file or a registry name.
        #[arg(long, env = "SLUICE_MODEL", default_value = "smollm2-135m-instruct")]
        model: String,
        /// Where registry models are cached.
        #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
        model_dir: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Serve(args) if args.check_config => match args.validate() {
            Ok(cfg) => {
                println!("{}", cfg.summary());
                Ok(())
            }
            Err(e) => {
                eprintln!("sluice serve: {e}");
                std::process::exit(1);
            }
        },
        Command::Serve(args) => {
            let cfg = match args.validate() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("sluice serve: {e}");
                    std::process::exit(2);
                }
            };
            init_logging();
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("sluice-http")
                .build()?
                .block_on(serve(cfg))
        }
        Command::Inspect { model, model_dir } => inspect(&model, &model_dir),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// The tenants of `--api-keys`, or an open gateway (with a warning).
fn tenants(cfg: &ServeConfig) -> Result<Tenants> {
    let tenants = match &cfg.api_keys {
        Some(p) => Tenants::from_file(p)?,
        None => Tenants::open(),
    };
    if tenants.is_open() {
        tracing::warn!("no --api-keys: the server is open to anyone who can reach it");
        if !cfg.addr.ip().is_loopback() {
            tracing::warn!(
                "binding {} without API keys exposes the model to the network",
                cfg.addr
            );
        }
    }
    Ok(tenants)
}

/// The handlers' shared state; the local model is set once it has loaded.
fn app_state(
    cfg: &ServeConfig,
    tenants: Tenants,
    served: Option<String>,
    router: Option<Arc<Router>>,
    registry: prometheus::Registry,
    metrics: GatewayMetrics,
) -> AppState {
    AppState {
        backend: OnceLock::new(),
        served_model: served,
        router,
        limiter: RateLimiter::new(&tenants),
        tenants,
        admission: Admission::new(AdmissionConfig {
            max_in_flight: cfg.max_in_flight,
            max_queue: cfg.max_queue,
            queue_timeout: cfg.queue_timeout,
            late_after: cfg.queue_late_after,
        }),
        metrics,
        registry,
        draining: AtomicBool::new(false),
        in_flight: Arc::default(),
        limits: HttpLimits {
            max_body_bytes: cfg.max_body_bytes,
            body_timeout: cfg.body_timeout,
            request_timeout: cfg.request_timeout,
        },
        log_prompts: cfg.log_prompts,
        trust_request_chat_template: cfg.trust_request_chat_template,
        max_prompt_tokens: cfg.max_prompt_tokens,
    }
}

/// Starts every discovery source feeding the router.
fn start_discovery(
    cfg: &ServeConfig,
    router: Option<&Arc<Router>>,
    addr: std::net::SocketAddr,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut sources = Vec::new();
    if let (Some(router), Some(routing)) = (router, &cfg.routing) {
        tracing::info!(
            %addr,
            policy = routing.router.policy.label(),
            sources = routing.sources.len(),
            "routing to remote replicas"
        );
        for source in routing.sources.clone() {
            sources.extend(discovery::spawn(
                source,
                router.clone(),
                routing.discover_interval,
            ));
        }
    }
    sources
}

async fn serve(cfg: ServeConfig) -> Result<()> {
    let tenants = tenants(&cfg)?;
    let location = cfg
        .model
        .as_deref()
        .map(|m| registry::resolve(m, &cfg.model_dir))
        .transpose()?;
    let served = location.as_ref().map(|l| {
        cfg.served_model_name
            .clone()
            .unwrap_or_else(|| l.name.clone())
    });
    let registry = prometheus::Registry::new();
    let metrics = GatewayMetrics::register(&registry)?;
    let router = cfg
        .routing
        .as_ref()
        .map(|r| Router::new(r.router.clone(), metrics.router.clone()));
    let state = Arc::new(app_state(
        &cfg,
        tenants,
        served.clone(),
        router.clone(),
        registry.clone(),
        metrics,
    ));
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .with_context(|| format!("binding {}", cfg.addr))?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line for the port.
    println!("sluice listening on http://{addr}");

    let sources = start_discovery(&cfg, router.as_ref(), addr);

    // Load in the background: /health answers at once, /ready once the model is in.
    if let (Some(location), Some(served)) = (location, served) {
        tracing::info!(%addr, model = %served, "listening; loading the model");
        let loader_state = state.clone();
        let loader_cfg = cfg.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = load(&loader_cfg, &location.path, served, registry, &loader_state) {
                tracing::error!("{e:#}");
                eprintln!("sluice serve: {e:#}");
                std::process::exit(1);
            }
        });
    }

    let drained = server::run(
        listener,
        api::app(state.clone()),
        state,
        ServeOptions {
            header_timeout: cfg.header_timeout,
            drain_timeout: cfg.drain_timeout,
        },
        server::shutdown_signal(),
    )
    .await;
    for s in sources {
        s.abort();
    }
    if let Some(r) = router {
        r.shutdown();
    }
    tracing::info!(drained, "stopped");
    Ok(())
}

fn load(
    cfg: &ServeConfig,
    path: &std::path::Path,
    served: String,
    registry: prometheus::Registry,
    state: &AppState,
) -> Result<()> {
    let model = Model::load(
        path,
        &ModelOptions {
            threads: cfg.threads,
            device: cfg.device,
            backend: cfg.backend,
        },
    )
    .with_context(|| format!("loading {}", path.display()))?;
    let mut model = model;
    if let Some(given) = &cfg.chat_template {
        model.set_chat_template(chat_template(given, &model)?);
    }
    let model = Arc::new(model);
    let mut ec = EngineConfig::for_model(&model);
    ec.model_name = served.clone();
    ec.max_num_seqs = cfg.max_num_seqs;
    ec.max_num_batched_tokens = cfg.max_num_batched_tokens;
    ec.max_model_len = cfg.max_model_len;
    ec.kv_cache_bytes = cfg.kv_cache_bytes;
    ec.gpu_memory_utilization = cfg.gpu_memory_utilization;
    ec.enable_prefix_caching = cfg.prefix_caching;
    // A routing gateway in front reads the replica's capacity from this series.
    sluice_gateway::metrics::register_max_num_seqs(&registry, &served, cfg.max_num_seqs)?;
    let engine = Engine::start_with_registry(model.clone(), ec, registry)?;
    tracing::info!(
        load_s = model.load_time().as_secs_f64(),
        kv_blocks = engine.num_kv_blocks(),
        max_model_len = engine.max_model_len(),
        "model loaded; ready"
    );
    let _ = state
        .backend
        .set(Arc::new(LocalBackend::new(served, engine)));
    Ok(())
}

/// `--chat-template`: a file's template, or the flag's text itself when no such file exists,
/// compiled for the model's tokenizer.
fn chat_template(given: &str, model: &Model) -> Result<ChatTemplate> {
    let path = std::path::Path::new(given);
    let source = match path.is_file() {
        true => std::fs::read_to_string(path)
            .with_context(|| format!("reading --chat-template {}", path.display()))?,
        false => given.to_string(),
    };
    ChatTemplate::for_tokenizer(&source, model.tokenizer())
        .context("compiling --chat-template (a file path, or the template itself)")
}

fn inspect(model: &str, model_dir: &std::path::Path) -> Result<()> {
    let location = registry::resolve(model, model_dir)?;
    let m = Model::load(&location.path, &ModelOptions::default())?;
    let c = m.config();
    println!(
        "model       {} ({})",
        location.name,
        location.path.display()
    );
    println!("arch        {} '{}'", c.architecture, c.name);
    println!(
        "layers      {}, width {}, ffn {}, heads {} (kv {}), head dim {}",
        c.block_count,
        c.embedding_length,
        c.feed_forward_length,
        c.head_count,
        c.head_count_kv,
        c.head_dim
    );
    println!(
        "context     {} tokens, vocab {}",
        c.context_length, c.vocab_size
    );
    println!("eos         {:?}", m.tokenizer().eos_ids());
    println!(
        "template    {}",
        if m.chat_template().is_some() {
            "yes"
        } else {
            "no"
        }
    );
    println!("load time   {:.2} s", m.load_time().as_secs_f64());
    Ok(())
}
