//! `syncmem completions SHELL`: a completion script for the shell, generated from the same
//! argument definitions that parse the command line (so it cannot drift from them).

use clap::CommandFactory;
use clap_complete::Shell;

/// Arguments of `syncmem completions`.
#[derive(clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_name = "SHELL")]
    pub shell: Shell,
}

const AFTER_HELP: &str = "\
Load the script the way the shell expects, for example:
  bash:  syncmem completions bash > ~/.local/share/bash-completion/completions/syncmem
  zsh:   syncmem completions zsh > ~/.zfunc/_syncmem   (with ~/.zfunc on $fpath)
  fish:  syncmem completions fish > ~/.config/fish/completions/syncmem.fish";

/// Prints the completion script of the command `C` for `args.shell` to stdout.
///
/// # Errors
/// When stdout cannot be written (a closed stdout is reported as such, and `main` treats it
/// as a normal end).
pub fn run<C: CommandFactory>(args: &Args) -> anyhow::Result<()> {
    let mut command = C::command();
    let name = command.get_name().to_string();
    // Generated into memory first: the generators give up on a failed write by panicking, and
    // a closed stdout (`syncmem completions bash | head`) is a normal end.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    super::stdout_result(std::io::Write::write_all(
        &mut std::io::stdout().lock(),
        &script,
    ))
}
