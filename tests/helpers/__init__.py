"""Helpers the tests run: chase.c (the C reference of the cost model's pointer chase) and fake_systemd/ (a
systemctl, journalctl and per-unit supervisor for hosts whose PID 1 is not systemd)."""
