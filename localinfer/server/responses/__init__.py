"""The OpenAI Responses API (POST /v1/responses): the route (routes.py), the request read as
the chat-completions request it means (input.py), and the response object with its streamed
events (events.py). It generates through the same engine path as /v1/chat/completions.
"""
