"""hostpin's acting half: reproducers that pin memory under chosen conditions, watched by a
watchdog, and that undo everything they did on every exit path. Builds on diag."""
