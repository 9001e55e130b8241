max_pool2d = None
