//! `myjob generate` (hidden; for packagers): the man pages and shell completions, made from the
//! clap definitions that also print `--help`, so that neither can drift from it.
//! `pkg/build-deb.sh` runs it to fill the package.

use std::path::PathBuf;

use clap::{Command, CommandFactory, Subcommand};
use clap_complete::Shell;

use crate::error::{Error, ExitCode, OrExit};

#[derive(Subcommand, Debug)]
pub enum What {
    /// Write myjob.1, one page per subcommand (myjob-run.1, …) and myjob.toml.5 into DIR.
    Man {
        /// The directory, which must exist.
        dir: PathBuf,
    },
    /// Write SHELL's completion script to stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: Shell,
    },
}

pub fn run(what: What) -> Result<(), Error> {
    let cmd = super::Cli::command();
    match what {
        // Hidden subcommands (guard, generate) get no page.
        What::Man { dir } => clap_mangen::generate_to(cmd, &dir)
            .and_then(|()| {
                let page = super::config_page::render(env!("CARGO_PKG_VERSION"));
                std::fs::write(dir.join("myjob.toml.5"), page)
            })
            .map_err(|e| anyhow::anyhow!("{}: cannot write the man pages: {e}", dir.display()))
            .or_exit(ExitCode::Usage),
        What::Completions { shell } => {
            let mut cmd = without_hidden(&cmd);
            clap_complete::generate(shell, &mut cmd, "myjob", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// The command as a user sees it: clap_complete's scripts would offer hidden subcommands
/// (guard, generate) beside the others, which clap_mangen and --help leave out.
fn without_hidden(cmd: &Command) -> Command {
    let mut visible = Command::new(cmd.get_name().to_owned()).args(cmd.get_arguments().cloned());
    if let Some(about) = cmd.get_about() {
        visible = visible.about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        visible = visible.version(version.to_owned());
    }
    visible.subcommands(
        cmd.get_subcommands()
            .filter(|sub| !sub.is_hide_set())
            .map(without_hidden),
    )
}
