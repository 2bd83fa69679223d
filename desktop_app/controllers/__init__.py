"""Logic that moves data between the store, the engine bridge and the widgets.

Kept apart from the widgets so that a widget only shows what it is handed, and from the
main window so that chat turns can be read (and tested) without the window's layout.
"""
