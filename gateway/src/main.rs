//! `sluice`: the gateway binary. For now it inspects models; `sluice serve` comes with the
//! gateway issue.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use sluice_models::{registry, Model, ModelOptions};

#[derive(Parser, Debug)]
#[command(name = "sluice", version, about = "LLM inference gateway and replica")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
        Command::Inspect { model, model_dir } => {
            let location = registry::resolve(&model, &model_dir)?;
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
        }
    }
    Ok(())
}
