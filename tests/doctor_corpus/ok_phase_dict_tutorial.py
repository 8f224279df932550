"""The shape of PyTorch's transfer-learning tutorial: a dict of loaders, one loop over phases,
`set_grad_enabled(phase == "train")`, StepLR(step_size=7) per epoch, best weights reloaded."""
# expect: none

import copy

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    dataloaders = {"train": train_loader, "val": val_loader}
    sizes = {phase: len(loader.dataset) for phase, loader in dataloaders.items()}
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)
    model = model.to(device)
    best_model_wts = copy.deepcopy(model.state_dict())
    best_acc = 0.0
    for _ in range(epochs):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            running_loss, running_corrects = 0.0, 0
            for inputs, labels in dataloaders[phase]:
                inputs, labels = inputs.to(device), labels.to(device)
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    _, preds = torch.max(outputs, 1)
                    loss = loss_fn(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                running_loss += loss.item() * inputs.size(0)
                running_corrects += torch.sum(preds == labels.data)
            if phase == "train":
                scheduler.step()
            epoch_acc = running_corrects.double() / sizes[phase]
            if phase == "val" and epoch_acc > best_acc:
                best_acc = epoch_acc
                best_model_wts = copy.deepcopy(model.state_dict())
    model.load_state_dict(best_model_wts)
    return model
