//! `ramd man` and `ramd completions`: documentation generated from the
//! clap definitions in `cli`, so it cannot drift from the commands.

use std::path::PathBuf;

use clap::CommandFactory;

use super::{Cli, CliError};

/// `ramd completions SHELL`.
pub(crate) fn completions(shell: clap_complete::Shell) {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "ramd", &mut std::io::stdout());
}

/// `ramd man [DIR]`.
pub(crate) fn man(dir: Option<PathBuf>) -> Result<(), CliError> {
    let cmd = Cli::command();
    let io = CliError::ManPage;
    match dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .map_err(io),
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(io)?;
            clap_mangen::generate_to(cmd, &dir).map_err(io)?;
            println!("wrote man pages to {}", dir.display());
            Ok(())
        }
    }
}
