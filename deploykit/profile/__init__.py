"""Profiles: the schema (`schema`), finding and loading files with located errors (`load`), and the
catalog behind `deploykit profiles list` (`catalog`)."""
