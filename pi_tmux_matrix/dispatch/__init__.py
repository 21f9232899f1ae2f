"""The tmux dispatcher: launch profiles, lanes, tmux, jobs and completion watching."""
