"""The shipped launch profiles (``*.toml``) and team templates (``teams/*.toml``).

Installed as the resource package ``pi_tmux_matrix.launch_profiles``; a regular package (not a
namespace) so that editable installs can import it and ``importlib.resources`` gives a plain path.
"""
