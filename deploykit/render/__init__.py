"""Render a plan as a systemd unit (`render.systemd`) or a Helm chart (`render.helm`), from the templates
in templates/. Importing this package is cheap: no torch, no vLLM."""
