"""A Trainer class that never moves the model or the batches to the requested device."""
# expect: wrong_device
# device: meta

import torch


class Trainer:
    def __init__(self, model, optimizer, loss_fn):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn

    def epoch(self, loader):
        self.model.train()
        for x, y in loader:
            self.optimizer.zero_grad()
            self.loss_fn(self.model(x), y).backward()
            self.optimizer.step()

    @torch.no_grad()
    def evaluate(self, loader):
        self.model.eval()
        return [self.model(x) for x, _ in loader]


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    trainer = Trainer(model, optimizer, loss_fn)
    for _ in range(epochs):
        trainer.epoch(train_loader)
        trainer.evaluate(val_loader)
