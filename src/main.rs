//! The `ramd` binary: see `ramd::cli` (commands) and `ramd::daemon`.

fn main() -> std::process::ExitCode {
    ramd::cli::main()
}
