"""Modal windows: the error dialog, settings, the model manager, and the file dialogs of
File ▸ Export/Import chat (chat_files).

`error_dialog.show_error` is the one way the app reports an error; the main window and
the model manager both call it, so neither needs to import the other.
"""
