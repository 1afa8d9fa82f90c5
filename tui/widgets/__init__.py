"""Widgets of the chat app: the message list, the status bar and the input box."""
