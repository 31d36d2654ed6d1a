"""Candidate vocabulary for triage's severity screen (vigil.logs.severity), written from documented log conventions
before it was replayed on any case: each group, as a regular expression, would make a line that the screen reads as
no error (strength 0) a generic candidate (strength 1), never more, so it can never outrank specific error wording,
a symptom or a signature. bench/screen_replay.py replays each group on the development halves of rounds 13-19 at
first touch and on today's development part; only groups that fix cases in two or more rounds and break none are
adopted into vigil.logs.severity.
"""

from __future__ import annotations

CANDIDATES: dict[str, str] = {
    # syslog priority names as they appear in text: RFC 5424 section 6.2.1 (Emergency, Alert, Critical, Error) and
    # syslog.h's prioritynames (emerg, alert, crit, err), printed by rsyslog's %syslogpriority-text% / as
    # facility.priority ("kern.err", "daemon.crit"), and journalctl -p / -o verbose PRIORITY names.
    "syslog_priority": r"\b(?:EMERG|ALERT|CRIT)\b|\b(?:kern|user|daemon|auth|authpriv|syslog|local[0-7])\."
                       r"(?:emerg|alert|crit|err)\b",
    # kernel printk level markers kept in text (include/linux/kern_levels.h: KERN_EMERG <0> .. KERN_ERR <3>; dmesg -r
    # and /dev/kmsg readers print them at the start of the line).
    "printk_level": r"^<[0-3]>",
    # level tokens of common loggers: Java util.logging SEVERE (java.util.logging.Level), log4j / logback FATAL
    # (already specific as FATAL / Fatal) and lowercase fatal in logfmt / zap / logrus output ("level=fatal"),
    # Python logging CRITICAL (logging module levels), Go's runtime "fatal error:" (runtime/panic.go throw) and
    # panics (already specific), Rust's std panic message "thread 'main' panicked at" (std::panic docs).
    "logger_level": r"\bSEVERE\b|\bCRITICAL\b|\bfatal\b|\bpanicked at\b",
    # general failure predicates, each group a family of one documented meaning; word boundaries, any case.
    "lost": r"(?i)\blost\b",
    "killed": r"(?i)\bkill(?:ed|ing)\b",
    "timeout": r"(?i)\btime(?:d)? ?out\b|\btimeouts?\b|\bexpired\b",
    "degraded": r"(?i)\bdegraded\b",
    "offline": r"(?i)\boffline\b",
    "unreachable": r"(?i)\bunreachable\b|\bnot responding\b",
    "refused": r"(?i)\brefused\b|\breject(?:ed|ing)\b|\bdenied\b",
    "aborted": r"(?i)\babort(?:ed|ing)\b",
    "evicted": r"(?i)\bevict(?:ed|ing|ion)\b",
    "disabled": r"(?i)\bdisabl(?:ed|ing)\b",
    "corrupt": r"(?i)\bcorrupt(?:ed|ion)?\b",
    "exceeded": r"(?i)\bexceed(?:ed|s)\b",
    "unhealthy": r"(?i)\bunhealthy\b",
    "fault": r"(?i)\bfault(?:ed|s)?\b",
}
