"""Serving a team: engine replicas on Ray Serve behind one language-server front end."""
