"""A Trainer class whose `validate` forgets `eval()`, with batches cached on the device."""
# expect: no_eval_mode

import torch


class Trainer:
    def __init__(self, model, opt, crit, device):
        self.model, self.opt, self.crit, self.device = model.to(device), opt, crit, device

    def cache(self, loader):
        return [(x.to(self.device), y.to(self.device)) for x, y in loader]

    def train_epoch(self, batches):
        self.model.train()
        for x, y in batches:
            self.opt.zero_grad()
            self.crit(self.model(x), y).backward()
            self.opt.step()

    @torch.inference_mode()
    def validate(self, batches):
        return sum(self.crit(self.model(x), y).item() for x, y in batches) / len(batches)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    t = Trainer(model, optimizer, loss_fn, device)
    train, val = t.cache(train_loader), t.cache(val_loader)
    return [(t.train_epoch(train), t.validate(val))[1] for _ in range(epochs)]
