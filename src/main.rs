//! The `ramd` binary: see `ramd::cli` (commands) and `ramd::control`.

fn main() -> std::process::ExitCode {
    ramd::cli::main()
}
