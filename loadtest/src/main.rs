//! `sluice-loadtest`: the load generator for OpenAI-compatible endpoints (the load-test issue
//! builds it). Until then it says so rather than pretending to measure anything.

fn main() -> std::process::ExitCode {
    eprintln!("sluice-loadtest: not implemented yet; the load-test issue builds it");
    std::process::ExitCode::from(2)
}
