"""The pieces of the window, and the theme they are drawn in.

Widgets import only Qt, `theme` and each other: they get the store's records, the
engine's snapshots and the bridge as plain objects from their owner, so each can be
built alone in a test.
"""
