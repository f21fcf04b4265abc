"""What both runtimes do per record: intake, decide_record, outcomes and their topics, timers."""
