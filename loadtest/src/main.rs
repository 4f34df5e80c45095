//! `sluice-loadtest`: parse flags, run, print the table, write files, and turn an error rate
//! above `--max-error-rate` into exit status 3 (so CI can gate on it). Ctrl-C or SIGTERM ends
//! the run early with a full report of what ran (exit status as usual); a second one quits.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use sluice_loadtest::config::{Args, Config};
use sluice_loadtest::stop::Stop;
use sluice_loadtest::{plot, session};

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice-loadtest: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main() -> anyhow::Result<ExitCode> {
    let cfg = Config::from_args(Args::parse())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let report = rt.block_on(async {
        let stop = Stop::default();
        stop.on_signals();
        session::execute_until(cfg, stop).await
    })?;
    print!("{}", report.render());
    if let Some(p) = &report.config.json {
        report.write_json(p)?;
    }
    if let Some(p) = &report.config.per_request {
        report.write_per_request(p)?;
    }
    if let Some(p) = &report.config.plot {
        plot::draw(&report, p)?;
    }
    if let Some(rate) = report.error_rate_exceeded() {
        eprintln!(
            "sluice-loadtest: error rate {:.2}% is above --max-error-rate {:.2}%",
            rate * 100.0,
            report.config.max_error_rate.unwrap_or(0.0) * 100.0
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
