"""Chats (SQLite) and settings (JSON), the app's state on disk.

Nothing here imports Qt (an import-linter contract keeps it so): the store and the
settings load in scripts, tests and the e2e kill test without a display or a QApplication.
"""
