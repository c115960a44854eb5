"""The window's Qt-free layer: what a chat window does, without widgets.

``ChatController`` (chat_controller.py) holds the conversation on screen, builds
each turn's request from the settings, takes the engine worker's typed events
and makes the record kept with each answer; ``passages.py`` puts a
conversation's documents into a turn and links an answer's ``[n]`` markers.
``app/ui`` renders this state and forwards the user's intent; tests drive the
controller with plain pytest (tests/controller/).
"""
