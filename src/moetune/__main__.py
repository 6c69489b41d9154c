from moetune.cli import entry

entry()
