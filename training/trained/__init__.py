"""What uses a finished run: trained policies loaded anywhere (policies), members as runs, evaluate, export, render, plot."""
