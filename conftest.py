"""Repository-wide pytest setup: nbval compares stdout and results, never stderr.

Warnings and progress bars go to stderr and differ between runs and machines; what a
notebook teaches is in its stdout, results and displays.
"""


def pytest_collection_modifyitems(items):
    for item in items:
        notebook = item.parent
        if hasattr(notebook, "skip_compare") and "stderr" not in notebook.skip_compare:
            notebook.skip_compare = notebook.skip_compare + ("stderr",)
