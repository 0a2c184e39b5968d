
__lesson__ = 4

