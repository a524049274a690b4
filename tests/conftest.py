pytest_plugins = ["minillm.course.pytest_plugin"]
