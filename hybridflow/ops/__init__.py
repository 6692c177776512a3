"""Unattended operation and what surrounds a run: notifications, doctor, cron schedules, init,
completion."""
