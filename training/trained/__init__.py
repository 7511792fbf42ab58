"""What uses a finished run: trained policies loaded anywhere (policies), members as runs (member_runs), evaluate, export, render, plot."""
