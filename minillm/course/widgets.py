"""Knobs in a notebook that still render headless: a figure drawn for the default values, redrawn on change.

    interact(draw_temperature, temperature=FloatSlider(value=1.0, min=0.1, max=3.0))

`draw(**values)` returns what to show (a matplotlib Figure, a string, anything IPython displays). The
default output is an ordinary display output, so nbclient and CI record it and the committed notebook shows
it; in a live kernel each change of a control replaces that output in place (IPython's display_id).
"""


def interact(draw, **controls):
    """Show the controls (ipywidgets) and draw(**their values) below them; redraw on every change."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import DisplayHandle, Pretty, display

    def render():
        out = draw(**{name: c.value for name, c in controls.items()})
        if isinstance(out, str):
            return Pretty(out)  # text as it is, not as a quoted string
        if isinstance(out, plt.Figure):
            plt.close(out)  # shown once through the handle, not again by the inline backend
        return out

    for name, control in controls.items():
        control.description = control.description or name
        control.style.description_width = "initial"
    display(widgets.HBox(list(controls.values())))
    handle = DisplayHandle()
    handle.display(render())
    for control in controls.values():
        control.observe(lambda _: handle.update(render()), names="value")
